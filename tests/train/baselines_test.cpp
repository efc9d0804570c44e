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
#include "tests/train/sim_support.hpp"

namespace gradlane::sched::sim {
namespace {

using namespace test_support;

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
