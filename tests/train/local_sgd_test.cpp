// The training simulator's local-SGD modes (perf/sched/cluster.hpp): local (H plain SGD steps
// per worker, then the mean of the models), gradlane-local (the same rule, its rounds' models
// summed at aggregators), local-ring (ring's allreduce every H minibatches), and priced pulls.
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

// With a probe before the first round (10 MB from every worker: 10 us + 4 ms at the straggler's
// 2.5 GB/s, longer than the 2 ms compute), the first round starts as the probe ends and already
// leaves the straggler out: rounds end at 4.01 ms + k x 2,406,908 ns + (k - 1) x 2 ms.
TEST(LocalRingSkip, AProbeBeforeTheFirstRoundMeasuresTheLinksForIt) {
  ClusterParams c = ring_of_eight(Mode::local_ring_skip);
  c.local_steps = 1;
  c.skip_slowest = 1;
  c.probe_bytes = 10'000'000;
  Cluster ring(c);
  ring.run_until(Instant{} + Nanos{6'416'907});
  EXPECT_EQ(ring.stats().steps, 0U) << "the first round started before the probe ended";
  ring.run_until(Instant{} + Nanos{6'416'908});
  EXPECT_EQ(ring.stats().steps, 1U);
  ring.run_until(Instant{} + Nanos{15'230'724});
  ASSERT_EQ(ring.stats().steps, 3U);
  EXPECT_EQ(ring.stats().drops, 3U) << "the straggler left out of every round, the first too";
  EXPECT_EQ(ring.stats().straggler_drops, 3U);
  c.mode = Mode::local_ring;
  c.skip_slowest = 0;
  EXPECT_TRUE(c.validate().has_value()) << "only the modes that measure the links probe them";
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
