// The deterministic pieces of the training simulator (perf/sched: cluster.hpp, training.hpp):
// what an update applies (sum for an aggregate, mean for a sync step), that sync over N
// workers is plain SGD on an N-times batch, FIFO's natural delay of N - 1, tau honoured,
// determinism per seed, and a short real run on Fashion-MNIST (the CI simulator run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "perf/sched/training.hpp"
#include "tests/train/sim_support.hpp"

namespace gradlane::sched::sim {
namespace {

using test_support::at_ms;
using test_support::softmax;

// A small random classification set with some structure (label = argmax of three features),
// so SGD on it makes progress.
train::Dataset synthetic_set(std::size_t rows, std::size_t features, std::uint32_t seed) {
  train::Dataset d;
  d.rows = rows;
  d.features = features;
  d.classes = 3;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0F, 1.0F);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t at = d.pixels.size();
    for (std::size_t f = 0; f < features; ++f) d.pixels.push_back(u(rng));
    const auto best = std::max_element(d.pixels.begin() + static_cast<std::ptrdiff_t>(at),
                                       d.pixels.begin() + static_cast<std::ptrdiff_t>(at + 3));
    d.labels.push_back(static_cast<std::uint8_t>(best - (d.pixels.begin() + static_cast<std::ptrdiff_t>(at))));
  }
  return d;
}

// Every worker identical (no jitter, no uneven links, no straggler), a fast server.
ClusterParams even_cluster(Mode mode, std::uint32_t workers) {
  ClusterParams c;
  c.mode = mode;
  c.workers = workers;
  c.bytes = 4096;
  c.compute_ms = 1.0;
  c.jitter = 0.0;
  c.worker_gbps = c.server_gbps = 100.0;
  c.stragglers = 0;
  c.tau = std::nullopt;
  return c;
}

double max_abs_difference(std::span<const float> a, std::span<const float> b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double{a[i]} - double{b[i]}));
  return worst;
}

TEST(SgdObserver, AnAggregateAppliesTheSumAndASyncStepTheMean) {
  const train::Dataset data = synthetic_set(64, 8, 1);
  const train::Model model(softmax(8));
  for (const Mode mode : {Mode::gradlane, Mode::sync}) {
    SgdObserver sgd(model, data, mode, 0.5F, 4, 3);
    const std::vector<float> start(sgd.parameters().begin(), sgd.parameters().end());
    // Two pulls of the same version share one snapshot.
    const std::uint64_t a = sgd.pulled(0), b = sgd.pulled(1);
    EXPECT_EQ(a, b);
    EXPECT_EQ(sgd.snapshots_allocated(), 1U);
    const Gradient members[] = {{RequestId{1}, 0, 0, a}, {RequestId{2}, 1, 0, b}};
    sgd.applied(members, Instant{});

    // The reference: the same two minibatches (the same seed's first two), on the start model.
    train::BatchSampler sampler(data.rows, 4, 3);
    std::vector<float> g1(model.parameters()), g2(model.parameters()), expected = start;
    train::Workspace work;
    model.gradient(start, data, sampler.next(), g1, work);
    model.gradient(start, data, sampler.next(), g2, work);
    const float scale = mode == Mode::sync ? 0.5F : 1.0F;
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] -= 0.5F * scale * (g1[i] + g2[i]);
    EXPECT_LT(max_abs_difference(sgd.parameters(), expected), 1e-6) << to_string(mode);
    EXPECT_GT(max_abs_difference(sgd.parameters(), start), 1e-3) << "the update must move the model";
    EXPECT_EQ(sgd.gradients_applied(), 2U);
    EXPECT_EQ(sgd.updates_applied(), 1U);
    // After the model moved, a pull takes a new snapshot (the old one was released and reused).
    EXPECT_EQ(sgd.pulled(0), a);
    EXPECT_EQ(sgd.snapshots_allocated(), 1U);
  }
}

TEST(TrainingSimulation, SyncOverNWorkersIsPlainSgdWithAnNTimesBatch) {
  constexpr std::uint32_t kWorkers = 4;
  constexpr std::size_t kBatch = 8;
  constexpr float kLr = 0.5F;
  // rows divisible by workers x batch: both samplers reshuffle at the same point.
  const train::Dataset data = synthetic_set(kWorkers * kBatch * 10, 8, 2);
  const train::Model model(softmax(8));
  SgdObserver sgd(model, data, Mode::sync, kLr, kBatch, 5);
  Cluster cluster(even_cluster(Mode::sync, kWorkers), &sgd);
  cluster.run_until(at_ms(30));
  const std::uint64_t steps = cluster.stats().steps;
  ASSERT_GE(steps, 15U);  // 25 epochs' worth of data would be plenty; 15 steps cross an epoch
  EXPECT_EQ(sgd.updates_applied(), steps);
  EXPECT_EQ(sgd.gradients_applied(), steps * kWorkers);

  std::vector<float> plain(model.parameters()), wrong(model.parameters()), g(model.parameters());
  model.initialise(plain, 5);
  wrong = plain;
  train::BatchSampler big(data.rows, kBatch * kWorkers, 5);
  train::BatchSampler big_again(data.rows, kBatch * kWorkers, 5);
  train::Workspace work;
  for (std::uint64_t s = 0; s < steps; ++s) {
    model.gradient(plain, data, big.next(), g, work);
    train::sgd_step(plain, g, kLr);
    model.gradient(wrong, data, big_again.next(), g, work);
    train::sgd_step(wrong, g, kLr * kWorkers);  // what summing instead of averaging would do
  }
  EXPECT_LT(max_abs_difference(sgd.parameters(), plain), 1e-5);
  EXPECT_GT(max_abs_difference(sgd.parameters(), wrong), 1e-2);
}

TEST(TrainingSimulation, FifoDelayIsNMinusOneOnceEveryWorkerIsRunning) {
  constexpr std::uint32_t kWorkers = 8;
  const train::Dataset data = synthetic_set(256, 8, 3);
  const train::Model model(softmax(8));
  SgdObserver sgd(model, data, Mode::fifo, 0.1F, 4, 1);
  Cluster cluster(even_cluster(Mode::fifo, kWorkers), &sgd);
  cluster.run_until(at_ms(20.5));
  const auto& delays = cluster.stats().delays;
  ASSERT_GE(delays.size(), 10U * kWorkers);
  // The first round all computed on version 0: applied at versions 0..N-1.
  for (std::uint32_t i = 0; i < kWorkers; ++i) EXPECT_EQ(delays[i], i);
  // From then on every worker pulls right after its push and N - 1 others land meanwhile.
  for (std::size_t i = kWorkers; i < delays.size(); ++i) ASSERT_EQ(delays[i], kWorkers - 1) << "update " << i;
  // Counted in gradients (the observer's view) it is the same: no aggregates in fifo.
  EXPECT_EQ(sgd.gradient_delays(), delays);
  EXPECT_EQ(cluster.stats().drops, 0U);
  EXPECT_EQ(cluster.stats().aggregates, 0U);
}

// An overloaded server: 200 workers, 1 ms steps, slow uneven links. gradlane aggregates and
// drops what would exceed tau; nothing applied is staler than tau.
ClusterParams overloaded(Mode mode, std::uint64_t seed) {
  ClusterParams c;
  c.mode = mode;
  c.seed = seed;
  c.workers = 200;
  c.bytes = 31'400;
  c.compute_ms = 2.0;
  c.worker_gbps = c.server_gbps = 10.0;
  c.spread = 4.0;
  c.change_ms = 5.0;
  c.stragglers = 5;
  c.tau = 100;
  return c;
}

TEST(TrainingSimulation, GradlaneHonoursTauAndAggregatesUnderOverload) {
  const train::Dataset data = synthetic_set(512, 8, 4);
  const train::Model model(softmax(8));
  SgdObserver sgd(model, data, Mode::gradlane, 0.001F, 4, 1);
  Cluster cluster(overloaded(Mode::gradlane, 1), &sgd);
  cluster.run_until(at_ms(40));
  const ClusterStats& s = cluster.stats();
  EXPECT_GT(s.aggregates, 0U);
  EXPECT_GT(s.drops, 0U);
  ASSERT_FALSE(s.delays.empty());
  EXPECT_LE(*std::max_element(s.delays.begin(), s.delays.end()), 100U);
  EXPECT_EQ(sgd.gradients_applied(), s.applied);
  // Fewer server versions than gradients: the aggregates.
  EXPECT_LT(sgd.updates_applied(), sgd.gradients_applied());
  // Every pulled snapshot is released once its gradient is applied or dropped: what is live is
  // at most one per worker plus those whose gradient is still travelling.
  EXPECT_LE(sgd.snapshots_allocated(), 2U * 200U);
}

// A short gradlane run on a synthetic 8-feature set, for tests about the run itself.
struct SmallRun {
  train::Dataset data = synthetic_set(512, 8, 5);
  train::Dataset eval = synthetic_set(200, 8, 6);
  train::Model model{softmax(8)};
  TrainParams params(double eval_every_ms, double duration_ms) const {
    TrainParams t;
    t.learning_rate = 0.002F;
    t.batch = 4;
    t.eval_every_ms = eval_every_ms;
    t.duration_ms = duration_ms;
    return t;
  }
};

TEST(TrainingSimulation, SameSeedSameRunOtherSeedOtherRun) {
  const SmallRun small;
  const auto& [data, eval, model] = small;
  const TrainParams t = small.params(5, 30);
  const auto run = [&](std::uint64_t seed) {
    TrainParams tp = t;
    tp.seed = seed;
    return train_in_simulation(overloaded(Mode::gradlane, seed), tp, model, data, eval);
  };
  const TrainResult a = run(7), b = run(7), c = run(8);
  ASSERT_EQ(a.curve.size(), 7U);  // t = 0, 5, ..., 30
  for (std::size_t i = 0; i < a.curve.size(); ++i) {
    EXPECT_EQ(a.curve[i].accuracy, b.curve[i].accuracy);
    EXPECT_EQ(a.curve[i].gradients, b.curve[i].gradients);
    EXPECT_EQ(a.curve[i].server_ingress_bytes, b.curve[i].server_ingress_bytes);
  }
  EXPECT_EQ(a.stats.delays, b.stats.delays);
  EXPECT_NE(a.stats.delays, c.stats.delays);
}

// stop_after_sustained: the run ends at the evaluation that confirms the first sustained
// crossing (it and the next two at or above the target), with the full run's curve up to there.
TEST(TrainingSimulation, StopAfterSustainedEndsWhereTheCrossingIsConfirmed) {
  const SmallRun small;
  const auto& [data, eval, model] = small;
  TrainParams t = small.params(2, 40);
  const TrainResult full = train_in_simulation(overloaded(Mode::gradlane, 3), t, model, data, eval);
  ASSERT_EQ(full.curve.size(), 21U);
  // A target the run sustains from evaluation 2 at the latest.
  t.target = std::min({full.curve[2].accuracy, full.curve[3].accuracy, full.curve[4].accuracy});
  std::size_t confirmed = 0;
  while (!(full.curve[confirmed].accuracy >= t.target && full.curve[confirmed + 1].accuracy >= t.target &&
           full.curve[confirmed + 2].accuracy >= t.target)) {
    ++confirmed;
  }
  confirmed += 2;
  ASSERT_LE(confirmed, 4U);
  t.stop_after_sustained = 2;
  const TrainResult stopped = train_in_simulation(overloaded(Mode::gradlane, 3), t, model, data, eval);
  ASSERT_EQ(stopped.curve.size(), confirmed + 1);
  for (std::size_t i = 0; i < stopped.curve.size(); ++i)
    EXPECT_EQ(stopped.curve[i].accuracy, full.curve[i].accuracy) << i;
}

// Every mode the simulator has, found through to_string: the CI run below must cover each.
std::vector<Mode> every_mode() {
  std::vector<Mode> modes;
  for (int i = 0; i <= 255; ++i) {
    if (std::string(to_string(static_cast<Mode>(i))) != "?") modes.push_back(static_cast<Mode>(i));
  }
  return modes;
}

// A learning rate that learns within the short run below: per gradient for the asynchronous
// modes (100 workers apply 100 gradients per compute time), per averaged step for the others.
float short_run_learning_rate(Mode mode) {
  if (averages_models(mode)) return 0.3F;
  if (is_synchronous(mode) || mode == Mode::fifo_sa) return 0.5F;
  return 0.005F;
}

// The CI simulator run: 100 workers on the real Fashion-MNIST for 300 simulated ms (a few
// seconds each). Accuracy must rise well above chance (0.10) in every mode.
TEST(TrainingSimulation, ShortFashionMnistRunLearnsInEveryMode) {
  const train::FashionMnist data = train::load_fashion_mnist();
  const train::Dataset train_set = data.train.slice(0, 50'000);
  const train::Dataset eval_set = data.test.slice(0, 2'000);
  const train::Model model(train::ModelSpec{});
  const std::vector<Mode> modes = every_mode();
  ASSERT_EQ(modes.size(), 13U) << "a mode was added or removed: it runs here too";
  for (const Mode mode : modes) {
    ClusterParams c;
    c.mode = mode;
    c.workers = 100;
    c.bytes = model.parameters() * sizeof(float);
    c.compute_ms = 5.0;
    c.worker_gbps = c.server_gbps = 25.0;
    c.spread = 4.0;
    c.change_ms = 50.0;
    c.tau = 200;
    if (skips_slowest(mode)) c.skip_slowest = 1;  // as train_sim's default: 1 %
    TrainParams t;
    t.learning_rate = short_run_learning_rate(mode);
    t.eval_every_ms = 100;
    t.duration_ms = 300;
    const TrainResult r = train_in_simulation(c, t, model, train_set, eval_set);
    ASSERT_EQ(r.curve.size(), 4U) << to_string(mode);
    EXPECT_NEAR(r.curve.front().accuracy, 0.1, 0.05) << "a zero softmax model guesses one class";
    EXPECT_GT(r.curve.back().accuracy, 0.6) << to_string(mode);
    EXPECT_GT(r.curve.back().accuracy, r.curve[1].accuracy - 0.02) << to_string(mode);
    EXPECT_GT(r.stats.applied, 1000U) << to_string(mode);
    if (skips_slowest(mode)) {
      EXPECT_GT(r.stats.drops, 0U) << to_string(mode) << " left no one out";
    }
  }
}

}  // namespace
}  // namespace gradlane::sched::sim
