// The baseline modes of the training simulator (perf/sched/cluster.hpp): fifo-sa (fifo's
// traffic, each gradient's learning rate divided by its delay), backup (sync whose step needs
// only the first workers - b updates), ssp (fifo within a clock bound), per-worker data
// shards (training.hpp DataOrder), and local SGD (sync every local_steps minibatches).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "perf/sched/training.hpp"

namespace gradlane::sched::sim {
namespace {

Instant at_ms(double ms) { return Instant{Nanos{static_cast<std::int64_t>(ms * 1e6)}}; }

train::Dataset random_set(std::size_t rows, std::size_t features, std::uint32_t seed) {
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

train::ModelSpec softmax(std::size_t features) {
  train::ModelSpec spec;
  spec.kind = train::ModelKind::softmax;
  spec.inputs = features;
  spec.classes = 3;
  return spec;
}

// Uneven, changing links into a busy server, stragglers: delays vary, so the modes differ.
ClusterParams busy(Mode mode) {
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

TEST(Baselines, ModesParseAndPrint) {
  for (const Mode mode :
       {Mode::fifo, Mode::gradlane, Mode::sync, Mode::fifo_sa, Mode::backup, Mode::ssp, Mode::ring, Mode::local,
        Mode::local_ring, Mode::local_ring_skip, Mode::local_tree, Mode::gradlane_local, Mode::gradlane_tree}) {
    EXPECT_EQ(parse_mode(to_string(mode)), mode);
  }
  EXPECT_STREQ(to_string(Mode::fifo_sa), "fifo-sa");
  try {
    parse_mode("hogwild");
    FAIL() << "an unknown mode must throw";
  } catch (const std::invalid_argument& e) {
    for (const char* name : {"fifo-sa", "backup", "ssp"})
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos);
  }
  ClusterParams c = busy(Mode::backup);
  c.backup_workers = c.workers;
  EXPECT_TRUE(c.validate().has_value()) << "no worker left to wait for";
}

// fifo-sa: a gradient of delay d moves the model by lr / d times its gradient (d = 0 and 1: lr).
TEST(Baselines, FifoSaStepsAGradientOfDelayDByLrOverD) {
  const train::Dataset data = random_set(64, 8, 1);
  const train::Model model(softmax(8));
  constexpr float kLr = 0.5F;
  for (const std::uint64_t delay : {0U, 1U, 4U, 10U}) {
    SgdObserver sa(model, data, Mode::fifo_sa, kLr, 4, 3);
    SgdObserver plain(model, data, Mode::fifo, kLr, 4, 3);
    const std::vector<float> start(sa.parameters().begin(), sa.parameters().end());
    const Gradient g_sa[] = {{RequestId{1}, 0, 0, sa.pulled(0), 0, delay}};
    const Gradient g_plain[] = {{RequestId{1}, 0, 0, plain.pulled(0), 0, delay}};
    sa.applied(g_sa, Instant{});
    plain.applied(g_plain, Instant{});
    const double expected_ratio = 1.0 / static_cast<double>(std::max<std::uint64_t>(1, delay));
    double moved_plain = 0;
    for (std::size_t i = 0; i < start.size(); ++i) {
      const double step_plain = double{plain.parameters()[i]} - start[i];
      const double step_sa = double{sa.parameters()[i]} - start[i];
      EXPECT_NEAR(step_sa, step_plain * expected_ratio, 1e-6) << "delay " << delay << " parameter " << i;
      moved_plain = std::max(moved_plain, std::abs(step_plain));
    }
    EXPECT_GT(moved_plain, 1e-3) << "the step must move the model";
  }
}

// fifo-sa changes the training rule only: its traffic is fifo's, event for event; and the delay
// the observer divides by is the one the cluster measured.
TEST(Baselines, FifoSaHasFifosTrafficAndSeesTheMeasuredDelays) {
  const train::Dataset data = random_set(512, 8, 2);
  const train::Model model(softmax(8));
  SgdObserver sgd_fifo(model, data, Mode::fifo, 0.01F, 4, 1), sgd_sa(model, data, Mode::fifo_sa, 0.01F, 4, 1);
  Cluster fifo(busy(Mode::fifo), &sgd_fifo), sa(busy(Mode::fifo_sa), &sgd_sa);
  fifo.run_until(at_ms(30));
  sa.run_until(at_ms(30));
  const ClusterStats &f = fifo.stats(), &s = sa.stats();
  ASSERT_GT(f.applied, 1000U);
  EXPECT_EQ(s.applied, f.applied);
  EXPECT_EQ(s.submitted, f.submitted);
  EXPECT_EQ(s.server_ingress_bytes, f.server_ingress_bytes);
  EXPECT_EQ(s.delays, f.delays);
  EXPECT_DOUBLE_EQ(s.latency_sum_ms, f.latency_sum_ms);
  EXPECT_GT(*std::max_element(s.delays.begin(), s.delays.end()), 1U) << "delays must vary for the rule to matter";
  // The models differ: the rule did something.
  double difference = 0;
  for (std::size_t i = 0; i < sgd_sa.parameters().size(); ++i) {
    difference = std::max(difference, std::abs(double{sgd_sa.parameters()[i]} - sgd_fifo.parameters()[i]));
  }
  EXPECT_GT(difference, 1e-4);
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
ClusterParams one_straggler(Mode mode, std::uint32_t workers, std::uint32_t stragglers, std::uint32_t backup) {
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

TEST(Baselines, BackupStepsNeverWaitForTheStragglerAndAverageExactlyN) {
  constexpr std::uint32_t kWorkers = 20;
  Recorder with_straggler, without_straggler, sync;
  Cluster backup(one_straggler(Mode::backup, kWorkers, 1, 1), &with_straggler);
  Cluster clean(one_straggler(Mode::backup, kWorkers, 0, 1), &without_straggler);
  Cluster plain_sync(one_straggler(Mode::sync, kWorkers, 1, 0), &sync);
  for (Cluster* c : {&backup, &clean, &plain_sync}) c->run_until(at_ms(100));
  // Every step averaged exactly N = workers - b gradients, none of them the straggler's.
  ASSERT_FALSE(with_straggler.sizes.empty());
  for (const std::size_t size : with_straggler.sizes) ASSERT_EQ(size, kWorkers - 1);
  EXPECT_EQ(std::count(with_straggler.workers.begin(), with_straggler.workers.end(), 0U), 0);
  EXPECT_EQ(backup.stats().straggler_applied, 0U);
  EXPECT_GT(backup.stats().abandoned + backup.stats().drops, 0U) << "the straggler's work is dropped";
  // Steps as fast as without the straggler (within 10%), several times faster than sync's.
  const double steps = static_cast<double>(backup.stats().steps);
  const double clean_steps = static_cast<double>(clean.stats().steps);
  EXPECT_GT(steps, 0.9 * clean_steps);
  EXPECT_GT(steps, 3.0 * static_cast<double>(plain_sync.stats().steps));
}

// ring: a step is the slowest compute, then 2(N-1) phases of (hop + bytes/N at the ring's
// slowest link); it averages all N gradients, each computed on the step before's model, and
// nothing reaches a server.
// Eight workers computing 2 ms steps (no jitter) over 10 GB/s links, one of them at 2.5 GB/s:
// the ring's slowest link; 8 MiB models, so 1 MiB per worker per phase; 10 us a hop.
ClusterParams ring_of_eight(Mode mode) {
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

TEST(Baselines, RingStepsTakeTheComputeThenTwoNMinusOnePhasesAtTheSlowestLink) {
  ClusterParams c = ring_of_eight(Mode::ring);
  Recorder slowed, even;
  Cluster ring(c, &slowed);
  c.stragglers = 0;
  Cluster clean(c, &even);
  ring.run_until(at_ms(100));
  clean.run_until(at_ms(100));
  // A phase: 10 us + 1,048,576 B / 2.5 GB/s = 429.4304 us; 14 phases 6,012,025.6 ns.
  const Nanos step = Nanos{2'000'000 + 6'012'026};
  ASSERT_EQ(slowed.times.size(), 12U);  // 100 ms / 8.012 ms
  for (std::size_t k = 0; k < slowed.times.size(); ++k) {
    EXPECT_EQ(slowed.times[k], Instant{} + static_cast<std::int64_t>(k + 1) * step) << "step " << k;
  }
  // Without the straggler a phase is 10 + 104.8576 us: 1.608 ms per allreduce, 27 steps.
  EXPECT_EQ(even.times.size(), 27U);
  for (const std::size_t size : slowed.sizes) EXPECT_EQ(size, 8U);
  EXPECT_EQ(ring.stats().applied, 12U * 8U);
  for (const std::uint64_t delay : ring.stats().delays) EXPECT_EQ(delay, 0U);
  EXPECT_EQ(ring.stats().server_ingress_bytes, 0U);
  EXPECT_EQ(ring.stats().steps, 12U);
}

TEST(Baselines, BackupWithNoSparesIsSync) {
  const train::Dataset data = random_set(512, 8, 3);
  const train::Model model(softmax(8));
  SgdObserver sgd_backup(model, data, Mode::backup, 0.1F, 4, 1), sgd_sync(model, data, Mode::sync, 0.1F, 4, 1);
  ClusterParams c = busy(Mode::backup);
  c.servers = 1;
  c.backup_workers = 0;
  Cluster backup(c, &sgd_backup);
  c.mode = Mode::sync;
  Cluster sync(c, &sgd_sync);
  backup.run_until(at_ms(40));
  sync.run_until(at_ms(40));
  ASSERT_GT(sync.stats().steps, 5U);
  EXPECT_EQ(backup.stats().steps, sync.stats().steps);
  EXPECT_EQ(backup.stats().applied, sync.stats().applied);
  EXPECT_EQ(backup.stats().server_ingress_bytes, sync.stats().server_ingress_bytes);
  EXPECT_EQ(backup.stats().drops + backup.stats().abandoned, 0U);
  // The same gradients averaged (summed in arrival rather than sequence order: float rounding).
  for (std::size_t i = 0; i < sgd_sync.parameters().size(); ++i) {
    ASSERT_NEAR(sgd_backup.parameters()[i], sgd_sync.parameters()[i], 1e-5) << i;
  }
}

TEST(Baselines, SspKeepsEveryClockWithinTheBoundOfTheSlowest) {
  for (const std::uint64_t bound : {0U, 1U, 3U}) {
    ClusterParams c = one_straggler(Mode::ssp, 20, 1, 0);
    c.ssp_bound = bound;
    Cluster ssp(c);
    ssp.run_until(at_ms(60));
    EXPECT_LE(ssp.stats().max_clock_lead, bound);
    EXPECT_GT(ssp.stats().ssp_waits, 0U) << "the straggler must hold the others back";
    EXPECT_GT(ssp.stats().applied, 20U * (bound + 1));
  }
  // Without the bound (fifo) the same cluster runs far ahead of its straggler.
  Cluster fifo(one_straggler(Mode::fifo, 20, 1, 0));
  fifo.run_until(at_ms(60));
  EXPECT_GT(fifo.stats().max_clock_lead, 10U);
}

TEST(Baselines, SspWithAnUnreachableBoundIsFifo) {
  ClusterParams c = busy(Mode::ssp);
  c.ssp_bound = 1'000'000;
  Cluster ssp(c);
  c.mode = Mode::fifo;
  Cluster fifo(c);
  ssp.run_until(at_ms(30));
  fifo.run_until(at_ms(30));
  ASSERT_GT(fifo.stats().applied, 1000U);
  EXPECT_EQ(ssp.stats().ssp_waits, 0U);
  EXPECT_EQ(ssp.stats().applied, fifo.stats().applied);
  EXPECT_EQ(ssp.stats().delays, fifo.stats().delays);
  EXPECT_EQ(ssp.stats().server_ingress_bytes, fifo.stats().server_ingress_bytes);
  EXPECT_EQ(ssp.stats().max_clock_lead, fifo.stats().max_clock_lead);
}

TEST(DataShards, EachWorkerDrawsOnlyFromItsOwnContiguousShard) {
  constexpr std::size_t kRows = 1000, kBatch = 8;
  for (const std::uint32_t workers : {7U, 125U, 1000U}) {  // 1000 workers: 125 shards of a batch each
    DataOrder order(kRows, kBatch, 5, workers);
    EXPECT_EQ(order.shards(), std::min<std::size_t>(workers, kRows / kBatch));
    std::vector<std::uint32_t> seen(kRows, 0);
    for (int round = 0; round < 200; ++round) {  // epochs enough that every row comes up
      for (std::uint32_t w = 0; w < workers; ++w) {
        const auto [first, last] = order.rows_of(w);
        ASSERT_GE(last - first, kBatch);
        for (const std::uint32_t row : order.next(w)) {
          ASSERT_GE(row, first) << "worker " << w;
          ASSERT_LT(row, last) << "worker " << w;
          ++seen[row];
        }
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 0U), 0) << "the shards cover the data";
  }
}

// End to end: rows of shard 0 carry features 0..3 only, of shard 1 features 4..7 only, so a
// softmax gradient from a worker touches only the weights of its own shard's features.
TEST(DataShards, TheObserverComputesAWorkersGradientOnItsShard) {
  constexpr std::size_t kFeatures = 8, kClasses = 3;
  train::Dataset data = random_set(64, kFeatures, 4);
  for (std::size_t r = 0; r < data.rows; ++r) {
    const std::size_t silent = r < data.rows / 2 ? kFeatures / 2 : 0;  // shard 0: 4..7 silent
    for (std::size_t f = silent; f < silent + kFeatures / 2; ++f) data.pixels[r * kFeatures + f] = 0.0F;
  }
  const train::Model model(softmax(kFeatures));
  for (const bool sharded : {true, false}) {
    SgdObserver sgd(model, data, Mode::fifo, 0.5F, 4, 1, sharded ? 2 : 0);
    double moved_outside = 0;
    for (int round = 0; round < 40; ++round) {  // several epochs of each shard
      const std::vector<float> before(sgd.parameters().begin(), sgd.parameters().end());
      const Gradient g[] = {{RequestId{1}, 0, 0, sgd.pulled(0), 0, 0}};  // worker 0
      sgd.applied(g, Instant{});
      for (std::size_t f = kFeatures / 2; f < kFeatures; ++f) {  // W is inputs x classes, row-major
        for (std::size_t k = 0; k < kClasses; ++k) {
          const std::size_t i = f * kClasses + k;
          moved_outside = std::max(moved_outside, std::abs(double{sgd.parameters()[i]} - before[i]));
        }
      }
    }
    if (sharded) {
      EXPECT_EQ(moved_outside, 0.0) << "worker 0 trained on rows outside its shard";
    } else {
      EXPECT_GT(moved_outside, 1e-4) << "one global order draws from both halves";
    }
  }
}

// gradlane_train_sim's wiring: TrainParams::data_shards reaches the observer.
TEST(DataShards, TrainInSimulationUsesThemWhenAsked) {
  const train::Dataset data = random_set(512, 8, 5);
  const train::Model model(softmax(8));
  TrainParams t;
  t.batch = 4;
  t.eval_every_ms = 5;
  t.duration_ms = 10;
  t.data_shards = true;
  const TrainResult sharded = train_in_simulation(busy(Mode::fifo), t, model, data, data);
  t.data_shards = false;
  const TrainResult global = train_in_simulation(busy(Mode::fifo), t, model, data, data);
  EXPECT_EQ(sharded.stats.applied, global.stats.applied);
  EXPECT_NE(sharded.curve.back().accuracy, global.curve.back().accuracy) << "other rows, other model";
}

}  // namespace
}  // namespace gradlane::sched::sim

namespace gradlane::sched::sim {
namespace {

// local: each worker's H plain SGD steps from the model it pulled, on the next H minibatches
// of the data order (worker by worker, as applied), then the mean of the workers' models.
TEST(LocalSgd, AStepAveragesTheWorkersModelsAfterTheirLocalSteps) {
  const train::Dataset data = random_set(256, 8, 5);
  const train::Model model(softmax(8));
  constexpr float kLr = 0.3F;
  constexpr std::uint32_t kH = 3;
  constexpr std::size_t kBatch = 4;
  SgdObserver local(model, data, Mode::local, kLr, kBatch, 7, 0, kH);
  const std::vector<float> start(local.parameters().begin(), local.parameters().end());
  const Gradient updates[] = {{RequestId{1}, 0, 0, local.pulled(0), 0, 0}, {RequestId{2}, 1, 0, local.pulled(1), 0, 0}};
  local.applied(updates, Instant{});

  // The same by hand: a DataOrder of the same seed, worker 0's H batches, then worker 1's.
  DataOrder order(data.rows, kBatch, 7);
  train::Workspace work;
  std::vector<float> mean(start.size(), 0.0F), gradient(start.size());
  for (int w = 0; w < 2; ++w) {
    std::vector<float> x = start;
    for (std::uint32_t h = 0; h < kH; ++h) {
      model.gradient(x, data, order.next(static_cast<std::uint32_t>(w)), gradient, work);
      train::sgd_step(x, gradient, kLr);
    }
    for (std::size_t i = 0; i < x.size(); ++i) mean[i] += x[i] / 2;
  }
  double moved = 0;
  for (std::size_t i = 0; i < start.size(); ++i) {
    EXPECT_NEAR(local.parameters()[i], mean[i], 1e-5) << i;
    moved = std::max(moved, std::abs(double{mean[i]} - start[i]));
  }
  EXPECT_GT(moved, 1e-3) << "the local steps must move the model";
  EXPECT_EQ(local.gradients_applied(), 2U * kH);
  EXPECT_EQ(local.updates_applied(), 1U);
}

// local's traffic is sync's, one push per H minibatches: with H = 1 it is sync (and the same
// model, up to float rounding); with H = 4 a step computes three 1 ms steps more.
TEST(LocalSgd, OneLocalStepIsSyncAndFourMakeStepsFourTimesTheCompute) {
  const train::Dataset data = random_set(512, 8, 6);
  const train::Model model(softmax(8));
  ClusterParams c = busy(Mode::sync);
  c.servers = 1;
  SgdObserver sgd_sync(model, data, Mode::sync, 0.1F, 4, 1);
  Cluster sync(c, &sgd_sync);
  c.mode = Mode::local;
  c.local_steps = 1;
  SgdObserver sgd_local(model, data, Mode::local, 0.1F, 4, 1, 0, 1);
  Cluster local(c, &sgd_local);
  sync.run_until(at_ms(40));
  local.run_until(at_ms(40));
  ASSERT_GT(sync.stats().steps, 5U);
  EXPECT_EQ(local.stats().steps, sync.stats().steps);
  EXPECT_EQ(local.stats().server_ingress_bytes, sync.stats().server_ingress_bytes);
  for (std::size_t i = 0; i < sgd_sync.parameters().size(); ++i) {
    ASSERT_NEAR(sgd_local.parameters()[i], sgd_sync.parameters()[i], 1e-5) << i;
  }

  // No jitter, a fast network: a step is its compute plus a short push.
  ClusterParams even = one_straggler(Mode::sync, 10, 0, 0);
  even.jitter = 0.0;
  Recorder one, four;
  Cluster h1(even, &one);
  even.mode = Mode::local;
  even.local_steps = 4;
  Cluster h4(even, &four);
  h1.run_until(at_ms(200));
  h4.run_until(at_ms(200));
  ASSERT_GE(four.times.size(), 10U);
  const double step_h1 = (one.times[9] - one.times[0]).count() / 9.0;
  const double step_h4 = (four.times[9] - four.times[0]).count() / 9.0;
  // Same push, three more 1 ms compute steps (no jitter): exactly 3 ms longer.
  EXPECT_NEAR(step_h4 - step_h1, 3e6, 1e3);
}

// gradlane-local's rule is local's: the mean of the workers' models after H local steps.
TEST(GradlaneLocal, AveragesModelsExactlyAsLocalSgdDoes) {
  const train::Dataset data = random_set(256, 8, 8);
  const train::Model model(softmax(8));
  SgdObserver local(model, data, Mode::local, 0.3F, 4, 9, 0, 3);
  SgdObserver gradlane_local(model, data, Mode::gradlane_local, 0.3F, 4, 9, 0, 3);
  const std::vector<float> start(local.parameters().begin(), local.parameters().end());
  const Gradient a[] = {{RequestId{1}, 0, 0, local.pulled(0), 0, 0}, {RequestId{2}, 1, 0, local.pulled(1), 0, 0}};
  const Gradient b[] = {{RequestId{1}, 0, 0, gradlane_local.pulled(0), 0, 0},
                        {RequestId{2}, 1, 0, gradlane_local.pulled(1), 0, 0}};
  local.applied(a, Instant{});
  gradlane_local.applied(b, Instant{});
  double moved = 0;
  for (std::size_t i = 0; i < start.size(); ++i) {
    ASSERT_EQ(gradlane_local.parameters()[i], local.parameters()[i]) << i;
    moved = std::max(moved, std::abs(double{local.parameters()[i]} - start[i]));
  }
  EXPECT_GT(moved, 1e-3);
  EXPECT_EQ(gradlane_local.gradients_applied(), 6U);
}

// local-ring: ring's allreduce after H minibatches instead of one: the step is H computes plus
// the same 2(N-1) phases, nothing reaches a server, and a step averages all N models.
TEST(LocalRing, AStepIsHComputesThenRingsAllreduce) {
  ClusterParams c = ring_of_eight(Mode::local_ring);
  c.local_steps = 3;
  Recorder rounds;
  Cluster local_ring(c, &rounds);
  local_ring.run_until(at_ms(100));
  // Three 2 ms computes, then the ring test's 6,012,025.6 ns allreduce.
  const Nanos step = Nanos{6'000'000 + 6'012'026};
  ASSERT_EQ(rounds.times.size(), 8U);  // 100 ms / 12.012 ms
  for (std::size_t k = 0; k < rounds.times.size(); ++k) {
    EXPECT_EQ(rounds.times[k], Instant{} + static_cast<std::int64_t>(k + 1) * step) << "round " << k;
  }
  for (const std::size_t size : rounds.sizes) EXPECT_EQ(size, 8U);
  EXPECT_EQ(local_ring.stats().server_ingress_bytes, 0U);
  EXPECT_EQ(local_ring.stats().steps, 8U);
}

// The server's ingress is the scarce link (workers 10x faster, pulls free): local SGD's round carries N
// models into it; gradlane-local's grants sum them at aggregators first, so a round carries
// fewer bytes there and rounds come faster. Every round still averages all N models, none
// dropped, though tau = 1 would drop most of them in gradlane mode.
TEST(GradlaneLocal, AggregatesARoundsModelsAndNeverDropsOne) {
  constexpr std::uint32_t kWorkers = 100;
  ClusterParams c;
  c.workers = kWorkers;
  c.bytes = 256 << 10;
  c.compute_ms = 1.0;
  c.worker_gbps = 100.0;
  c.server_gbps = 10.0;
  c.local_steps = 2;
  c.tau = 1;
  c.pulls = PullCost::free;  // the server's ingress alone (Pulls.* price its egress)
  c.mode = Mode::local;
  Recorder by_server, by_gradlane;
  Cluster local(c, &by_server);
  c.mode = Mode::gradlane_local;
  Cluster gradlane_local(c, &by_gradlane);
  local.run_until(at_ms(200));
  gradlane_local.run_until(at_ms(200));

  ASSERT_GE(by_server.sizes.size(), 3U);
  ASSERT_GE(by_gradlane.sizes.size(), 3U);
  for (const std::size_t size : by_gradlane.sizes) ASSERT_EQ(size, kWorkers) << "a round averages every model";
  EXPECT_EQ(by_gradlane.drops, 0U);
  const ClusterStats& g = gradlane_local.stats();
  EXPECT_EQ(g.drops, 0U);
  EXPECT_GE(g.applied, g.steps * kWorkers);  // and part of the round in progress
  EXPECT_LT(g.applied, (g.steps + 1) * kWorkers);
  EXPECT_GT(g.aggregated, 0U) << "models must be summed at aggregators";

  const ClusterStats& l = local.stats();
  EXPECT_EQ(l.aggregated, 0U);
  const auto per_round = [](const ClusterStats& s) {
    return static_cast<double>(s.server_ingress_bytes) / static_cast<double>(s.steps);
  };
  // local: every model crosses the server's ingress (a round in flight adds at most one more).
  EXPECT_GE(per_round(l), kWorkers * static_cast<double>(c.bytes) * 0.99);
  EXPECT_LT(per_round(g), 0.5 * per_round(l));
  EXPECT_GT(g.steps, 2 * l.steps) << "rounds bound by the server's ingress come faster";
}

// A priced pull is the model from the server's egress to the worker's ingress before it
// computes: a sync step of N workers gains N x bytes at the server's egress rate (the N pulls
// share it), the egress counts those bytes, and ring's modes (their allgather is their pull)
// are unchanged.
TEST(Pulls, APricedPullAddsTheModelsCrossingOfTheServersEgressToEveryStep) {
  constexpr std::uint32_t kWorkers = 10;
  ClusterParams c = one_straggler(Mode::sync, kWorkers, 0, 0);
  c.jitter = 0.0;
  c.server_gbps = 10.0;  // 1.25 GB/s; workers at 100 Gb/s
  c.pulls = PullCost::free;
  Recorder free_pulls, priced_pulls;
  Cluster free_cluster(c, &free_pulls);
  c.pulls = PullCost::priced;
  Cluster priced(c, &priced_pulls);
  free_cluster.run_until(at_ms(60));
  priced.run_until(at_ms(60));
  ASSERT_GE(priced_pulls.times.size(), 5U);
  const auto period = [](const Recorder& r) { return static_cast<double>((r.times[4] - r.times[0]).count()) / 4; };
  const double pull_ns = kWorkers * static_cast<double>(c.bytes) / (c.server_gbps * 1e9 / 8) * 1e9;  // 2,097,152
  EXPECT_NEAR(period(priced_pulls) - period(free_pulls), pull_ns, 10.0);
  const ClusterStats& s = priced.stats();
  EXPECT_EQ(free_cluster.stats().pulls, 0U);
  EXPECT_EQ(free_cluster.stats().server_egress_bytes, 0U);
  EXPECT_GE(s.pulls, 4U * kWorkers);
  EXPECT_GE(s.server_egress_bytes + 1, s.pulls * c.bytes);  // and what is on the wire now
  EXPECT_LT(s.server_egress_bytes, (s.pulls + kWorkers) * c.bytes);

  for (const Mode ring_mode : {Mode::ring, Mode::local_ring}) {
    c.mode = ring_mode;
    c.pulls = PullCost::free;
    Recorder a, b;
    Cluster without(c, &a);
    c.pulls = PullCost::priced;
    Cluster with(c, &b);
    without.run_until(at_ms(30));
    with.run_until(at_ms(30));
    ASSERT_FALSE(b.times.empty());
    EXPECT_EQ(b.times, a.times) << to_string(ring_mode);
    EXPECT_EQ(with.stats().pulls, 0U);
  }
}

// backup with priced pulls: every step still averages workers - b, the late ones' pushes
// dropped while every worker pulls the step's model.
TEST(Pulls, BackupWithPricedPullsAveragesWorkersMinusBEveryStep) {
  constexpr std::uint32_t kWorkers = 10;
  ClusterParams c = one_straggler(Mode::backup, kWorkers, 0, 2);
  c.server_gbps = 10.0;
  c.pulls = PullCost::priced;
  Recorder r;
  Cluster backup(c, &r);
  backup.run_until(at_ms(100));
  ASSERT_GE(r.sizes.size(), 5U);
  for (const std::size_t size : r.sizes) ASSERT_EQ(size, kWorkers - 2);
  EXPECT_GT(backup.stats().pulls, 0U);
}

// local-ring-skip: the first round is local-ring's (nothing measured yet); later ones ring the
// workers not left out, then send the mean to each left-out one from the fastest member.
TEST(LocalRingSkip, LaterRoundsRingTheRestThenSendTheMeanToTheLeftOut) {
  ClusterParams c = ring_of_eight(Mode::local_ring_skip);
  c.local_steps = 1;
  c.skip_slowest = 1;
  Cluster ring(c);
  ring.run_until(Instant{} + std::chrono::microseconds(16'825));
  // Round 1: 2 ms + the ring test's 6,012,025.6 ns. Rounds 2, 3: 2 ms + 12 phases of
  // (10 us + 8 MiB / 7 / 10 GB/s) + 10 us + 8 MiB / 10 GB/s = 2 ms + 2,406,908 ns: the third
  // ends at 16,825.84 us.
  EXPECT_EQ(ring.stats().steps, 2U);
  ring.run_until(Instant{} + std::chrono::microseconds(16'827));
  ASSERT_EQ(ring.stats().steps, 3U);
  EXPECT_EQ(ring.stats().drops, 2U) << "the straggler left out of rounds 2 and 3";
  EXPECT_EQ(ring.stats().straggler_drops, 2U);
}

// Each pulled model is released once, whatever leaves it out: SgdObserver throws on a second
// release. Rounds that skip, and backup's priced pulls, over real training.
TEST(Pulls, EverySkippedOrAbandonedModelIsReleasedOnce) {
  const train::Dataset data = random_set(256, 8, 9);
  const train::Model model(softmax(8));
  for (const Mode mode : {Mode::gradlane_tree, Mode::local_ring_skip, Mode::backup}) {
    ClusterParams c = one_straggler(mode, 15, 3, 2);
    c.bytes = 256 << 10;
    c.local_steps = 2;
    c.skip_slowest = mode == Mode::backup ? 0 : 3;
    SgdObserver sgd(model, data, mode, 0.1F, 4, 1, 0, c.local_steps);
    Cluster cluster(c, &sgd);
    EXPECT_NO_THROW(cluster.run_until(at_ms(60))) << to_string(mode);
    EXPECT_GT(cluster.stats().drops + cluster.stats().abandoned, 0U) << to_string(mode);
  }
}

}  // namespace
}  // namespace gradlane::sched::sim
