// The parameter server's roles as Prometheus sources (gradlane/metrics.hpp): call update() or
// record() from the thread that runs the role, add the source to an Exporter, and a scrape
// shows the role's numbers as of that call.
//
//   gradlane::metrics::Exporter exporter("0.0.0.0:9464");
//   auto metrics = std::make_shared<gradlane::ps::ServerMetrics>("server", floats * sizeof(float));
//   exporter.add(metrics);
//   while (!server.finished()) { server.progress(); metrics->update(server); }
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>

#include "gradlane/metrics.hpp"
#include "gradlane/ps/aggregator.hpp"
#include "gradlane/ps/server.hpp"
#include "gradlane/ps/worker.hpp"

namespace gradlane::ps {

// A shard server's or replica's: updates applied and skipped (holes), refusals by kind, peers,
// bytes applied, the replica's lag, failovers, and each applied update's staleness (its
// version's distance from the one it was computed on) overall and per worker, with a straggler
// score: a worker's mean staleness over the median of the workers' means (1: typical; a
// straggler's updates are the stalest). Staleness counts only updates whose computed_on the
// server knows (direct mode, and sidecar-mode pushes that announced it).
class ServerMetrics final : public prometheus::Collectable {
 public:
  // `role`: the value of the `role` label ("server", "replica"); `update_bytes`: the bytes of
  // one update (the shard's floats × 4).
  ServerMetrics(std::string role, std::uint64_t update_bytes);
  void update(const ShardServer& server);
  // The same from the numbers update() reads: `history` is the whole applied log so far (only
  // what was appended since the last call is new), `version` the shard's.
  void update(const ServerStats& stats, std::span<const AppliedUpdate> history, std::uint64_t version);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct PerWorker {
    std::uint64_t updates = 0;
    std::uint64_t staleness_sum = 0;
    std::uint64_t with_staleness = 0;
  };
  mutable std::mutex mutex_;
  std::string role_;
  std::uint64_t update_bytes_;
  ServerStats stats_;
  std::uint64_t version_ = 0;
  std::size_t seen_ = 0;  // history entries already counted
  metrics::Histogram staleness_;
  std::map<std::uint32_t, PerWorker> workers_;
};

// A worker's: pushes by outcome (applied = acknowledged, dropped, lost, pending at an
// aggregator) and the time each push() took.
class WorkerMetrics final : public prometheus::Collectable {
 public:
  explicit WorkerMetrics(std::uint32_t worker);
  void record(const PushResult& result, std::chrono::nanoseconds took);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable std::mutex mutex_;
  std::string worker_;
  std::uint64_t acknowledged_ = 0, dropped_ = 0, lost_ = 0, pending_ = 0, expired_grants_ = 0;
  metrics::Histogram push_seconds_;
};

// An aggregator's: members granted, summed and skipped, updates forwarded (short groups, lost),
// refusals, peers, bytes the CPU copied.
class AggregatorMetrics final : public prometheus::Collectable {
 public:
  AggregatorMetrics() = default;
  void update(const Aggregator& aggregator) { update(aggregator.stats()); }
  void update(const AggregatorStats& stats);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable std::mutex mutex_;
  AggregatorStats stats_;
};

}  // namespace gradlane::ps
