// What the training simulator's tests share: a tiny random data set and softmax, the clusters
// the baseline tests run (busy, one straggler, a ring of eight), and an observer that records every update.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "perf/sched/training.hpp"

namespace gradlane::sched::sim::test_support {

inline Instant at_ms(double ms) { return Instant{Nanos{static_cast<std::int64_t>(ms * 1e6)}}; }

inline train::Dataset random_set(std::size_t rows, std::size_t features, std::uint32_t seed) {
  train::Dataset d;
  d.rows = rows;
  d.features = features;
  d.classes = 3;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0F, 1.0F);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t f = 0; f < features; ++f) d.pixels.push_back(u(rng));
    d.labels.push_back(static_cast<std::uint8_t>(r % 3));
  }
  return d;
}

inline train::ModelSpec softmax(std::size_t features) {
  train::ModelSpec spec;
  spec.kind = train::ModelKind::softmax;
  spec.inputs = features;
  spec.classes = 3;
  return spec;
}

// Uneven, changing links into a busy server, stragglers: delays vary, so the modes differ.
inline ClusterParams busy(Mode mode) {
  ClusterParams c;
  c.mode = mode;
  c.workers = 100;
  c.bytes = 31'400;
  c.compute_ms = 1.0;
  c.worker_gbps = c.server_gbps = 10.0;
  c.spread = 4.0;
  c.change_ms = 5.0;
  c.stragglers = 3;
  c.tau = std::nullopt;
  return c;
}

// An observer that records every update it is given.
class Recorder : public Observer {
 public:
  std::uint64_t pulled(std::uint32_t /*worker*/) override { return next_token_++; }
  void applied(std::span<const Gradient> gradients, Instant now) override {
    sizes.push_back(gradients.size());
    times.push_back(now);
    for (const Gradient& g : gradients) workers.push_back(g.worker);
  }
  void dropped(const Gradient& /*gradient*/) override { ++drops; }
  std::vector<std::size_t> sizes;
  std::vector<Instant> times;
  std::vector<std::uint32_t> workers;
  std::uint64_t drops = 0;

 private:
  std::uint64_t next_token_ = 0;
};

// Even workers, one straggler whose egress is 200x slower: its update takes ~10 compute steps.
inline ClusterParams one_straggler(Mode mode, std::uint32_t workers, std::uint32_t stragglers, std::uint32_t backup) {
  ClusterParams c;
  c.mode = mode;
  c.workers = workers;
  c.bytes = 256 << 10;
  c.compute_ms = 1.0;
  c.jitter = 0.1;
  c.worker_gbps = c.server_gbps = 100.0;
  c.stragglers = stragglers;
  c.straggler_slowdown = 200.0;
  c.backup_workers = backup;
  return c;
}

// Eight workers computing 2 ms steps (no jitter) over 10 GB/s links, one of them at 2.5 GB/s:
// the ring's slowest link; 8 MiB models, so 1 MiB per worker per phase; 10 us a hop.
inline ClusterParams ring_of_eight(Mode mode) {
  ClusterParams c;
  c.mode = mode;
  c.workers = 8;
  c.bytes = 8 << 20;
  c.compute_ms = 2.0;
  c.jitter = 0.0;
  c.worker_gbps = c.server_gbps = 80.0;
  c.stragglers = 1;
  c.straggler_slowdown = 4.0;
  c.ring_hop_us = 10.0;
  return c;
}

}  // namespace gradlane::sched::sim::test_support
