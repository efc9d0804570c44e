// The pipelined binary-tree allreduce's price (perf/sched/tree_allreduce.hpp) and the tree
// modes of the cluster: a random placement, fixed, and the scheduler's, slowest at the leaves.
#include "perf/sched/tree_allreduce.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "perf/sched/cluster.hpp"

namespace gradlane::sched::sim {
namespace {

// A root and two leaves, every rate r: each direction is one edge whose link carries two streams
// (the root's ingress up, its egress down) at r / 2; one chunk is best on one edge.
TEST(TreeAllreduce, ARootAndTwoLeavesMoveTheBytesAtHalfTheRateEachWay) {
  const std::vector<double> rate(3, 1e9);
  constexpr double kBytes = 1e6, kHop = 1e-5;
  EXPECT_DOUBLE_EQ(tree_allreduce_seconds(rate, rate, kBytes, kHop), 2 * (kHop + kBytes / 0.5e9));
  EXPECT_EQ(tree_allreduce_seconds(std::vector<double>{1e9}, std::vector<double>{1e9}, kBytes, kHop), 0.0);
  EXPECT_THROW(tree_allreduce_seconds(rate, std::vector<double>(2, 1e9), kBytes, kHop), std::invalid_argument);
  EXPECT_THROW(tree_allreduce_seconds(std::vector<double>{1e9, 0.0}, std::vector<double>(2, 1e9), kBytes, kHop),
               std::invalid_argument);
}

// A leaf that does not upload only receives: the root's ingress carries one stream up, so the
// reduce runs at the full rate; the broadcast still feeds two.
TEST(TreeAllreduce, ALeafThatSendsNothingFreesItsParentsIngress) {
  const std::vector<double> rate(3, 1e9);
  constexpr double kBytes = 1e6, kHop = 1e-5;
  EXPECT_DOUBLE_EQ(tree_allreduce_seconds(rate, rate, kBytes, kHop, 2),
                   (kHop + kBytes / 1e9) + (kHop + kBytes / 0.5e9));
  const std::vector<double> seven(7, 1e9);
  EXPECT_THROW(tree_allreduce_seconds(seven, seven, kBytes, kHop, 2), std::invalid_argument)
      << "position 2 has children: it must upload";
  EXPECT_NO_THROW(tree_allreduce_seconds(seven, seven, kBytes, kHop, 3));
}

// Where a slow link sits: at a leaf it slows only the reduce (its upload); at an inner node
// the reduce and the broadcast (it forwards to its children); at the root only the broadcast.
TEST(TreeAllreduce, ASlowLinkCostsLeastAtALeafAndMostAtAnInnerNode) {
  constexpr double kBytes = 4e6, kHop = 5e-6, kFast = 1e9, kSlow = 1e8;
  const std::vector<double> ingress(7, kFast);
  const auto with_slow_at = [&](std::size_t position) {
    std::vector<double> egress(7, kFast);
    egress[position] = kSlow;
    return tree_allreduce_seconds(egress, ingress, kBytes, kHop);
  };
  const double leaf = with_slow_at(6), inner = with_slow_at(1), root = with_slow_at(0);
  const double all_fast = tree_allreduce_seconds(std::vector<double>(7, kFast), ingress, kBytes, kHop);
  EXPECT_GT(leaf, all_fast);
  EXPECT_GT(inner, leaf);
  EXPECT_GT(inner, root);
  // Pipelined, a leaf's upload at 1e8 bounds the reduce: at least bytes / 1e8, and the
  // broadcast at least bytes / (1e9 / 2).
  EXPECT_GE(leaf, kBytes / kSlow + kBytes / (kFast / 2));
  EXPECT_LT(leaf, 1.05 * (kBytes / kSlow + kBytes / (kFast / 2)));
}

TEST(TreeAllreduce, TheSchedulersPlacementPutsTheSlowestAtTheLeaves) {
  const std::vector<double> egress = {5, 1, 9, 3, 7, 2, 8};
  const std::vector<std::uint32_t> order = place_slowest_at_leaves(egress);
  ASSERT_EQ(order.size(), 7U);
  EXPECT_EQ(order, (std::vector<std::uint32_t>{2, 6, 4, 0, 3, 5, 1}));  // positions 3..6 are the leaves
}

// 15 workers computing 2 x 1 ms between averages of 8 MiB over 10 GB/s links, `slow` of them
// at 1/20 of that.
ClusterParams fifteen_workers(std::uint32_t slow) {
  ClusterParams c;
  c.workers = 15;
  c.bytes = 8 << 20;
  c.compute_ms = 1.0;
  c.jitter = 0.0;
  c.worker_gbps = c.server_gbps = 80.0;
  c.stragglers = slow;
  c.straggler_slowdown = 20.0;
  c.local_steps = 2;
  return c;
}

// Both tree modes start from the same random placement; gradlane-tree then measures the links
// and puts the slow ones at the leaves, so its later rounds are shorter; the rounds average
// every model and nothing crosses a server.
TEST(TreeAllreduce, TheSchedulersTreeMakesLaterRoundsShorterThanARandomOnes) {
  ClusterParams c = fifteen_workers(7);  // 7 of 15 slow: a random order puts some inside the tree
  c.mode = Mode::local_tree;
  Cluster random_tree(c);
  c.mode = Mode::gradlane_tree;
  Cluster placed_tree(c);
  random_tree.run_until(Instant{} + std::chrono::milliseconds(400));
  placed_tree.run_until(Instant{} + std::chrono::milliseconds(400));
  const ClusterStats &r = random_tree.stats(), &g = placed_tree.stats();
  ASSERT_GE(r.steps, 2U);
  EXPECT_GT(g.steps, r.steps + r.steps / 2) << "the placed tree's rounds are much shorter";
  EXPECT_EQ(g.server_ingress_bytes, 0U);
  EXPECT_EQ(g.applied, g.steps * c.workers);
  EXPECT_EQ(g.pulls, 0U);
}

// With skip_slowest, once measured, a round does not wait for the slowest links: their
// models are left out (dropped, the stragglers' here), and the rounds come faster still.
TEST(TreeAllreduce, TheSchedulersTreeLeavesTheSlowestOutOnceItMeasuredThem) {
  ClusterParams c = fifteen_workers(3);
  c.mode = Mode::gradlane_tree;
  Cluster waits(c);
  c.skip_slowest = 3;
  Cluster skips(c);
  waits.run_until(Instant{} + std::chrono::milliseconds(400));
  skips.run_until(Instant{} + std::chrono::milliseconds(400));
  const ClusterStats &w = waits.stats(), &s = skips.stats();
  ASSERT_GE(s.steps, 3U);
  EXPECT_EQ(w.drops, 0U);
  EXPECT_EQ(s.drops, (s.steps - 1) * 3) << "every round after the first leaves 3 out";
  EXPECT_EQ(s.straggler_drops, s.drops) << "the ones left out are the slowest: the stragglers";
  EXPECT_EQ(s.applied, s.steps * c.workers - s.drops);
  EXPECT_GT(s.steps, 2 * w.steps);
  c.skip_slowest = 9;  // 6 uploaders of 15: position 6 would not send, though it has children
  EXPECT_TRUE(c.validate().has_value());
  c.mode = Mode::local_tree;
  c.skip_slowest = 1;
  EXPECT_TRUE(c.validate().has_value()) << "only gradlane-tree skips";
}

// Even links: the placement cannot matter, and a round is the H computes plus exactly the
// tree's price.
TEST(TreeAllreduce, WithEvenLinksARoundIsTheComputeThenTheTreesPrice) {
  ClusterParams c = fifteen_workers(0);
  c.mode = Mode::local_tree;
  Cluster tree(c);
  tree.run_until(Instant{} + std::chrono::milliseconds(100));
  const std::vector<double> rate(15, 80.0 * 1e9 / 8);
  const double allreduce = tree_allreduce_seconds(rate, rate, 8 << 20, c.ring_hop_us * 1e-6);
  const double round_ms = 2.0 + allreduce * 1e3;
  ASSERT_GT(allreduce, 0.0);
  EXPECT_EQ(tree.stats().steps, static_cast<std::uint64_t>(100.0 / round_ms)) << round_ms << " ms a round";
}

}  // namespace
}  // namespace gradlane::sched::sim
