// The pipelined tree allreduce's price (perf/sched/tree_allreduce.hpp), the tree a scheduler
// shapes to the links, and the tree modes of the cluster: a random placement, fixed, and the
// scheduler's, slowest at the leaves.
#include "perf/sched/tree_allreduce.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "perf/sched/cluster.hpp"

namespace gradlane::sched::sim {
namespace {

// A binary heap over the positions, the reduce then the broadcast.
double sequential_heap(std::span<const double> egress, std::span<const double> ingress, double bytes, double hop,
                       std::size_t uploaders = std::numeric_limits<std::size_t>::max()) {
  return tree_allreduce_seconds(heap_tree(egress.size()), egress, ingress, bytes, hop, TreePhases::sequential,
                                uploaders);
}

// A root and two leaves, every rate r: each direction is one edge whose link carries two streams
// (the root's ingress up, its egress down) at r / 2; one chunk is best on one edge.
TEST(TreeAllreduce, ARootAndTwoLeavesMoveTheBytesAtHalfTheRateEachWay) {
  const std::vector<double> rate(3, 1e9);
  constexpr double kBytes = 1e6, kHop = 1e-5;
  EXPECT_DOUBLE_EQ(sequential_heap(rate, rate, kBytes, kHop), 2 * (kHop + kBytes / 0.5e9));
  EXPECT_EQ(sequential_heap(std::vector<double>{1e9}, std::vector<double>{1e9}, kBytes, kHop), 0.0);
  EXPECT_THROW(sequential_heap(rate, std::vector<double>(2, 1e9), kBytes, kHop), std::invalid_argument);
  EXPECT_THROW(sequential_heap(std::vector<double>{1e9, 0.0}, std::vector<double>(2, 1e9), kBytes, kHop),
               std::invalid_argument);
}

// A leaf that does not upload only receives: the root's ingress carries one stream up, so the
// reduce runs at the full rate; the broadcast still feeds two.
TEST(TreeAllreduce, ALeafThatSendsNothingFreesItsParentsIngress) {
  const std::vector<double> rate(3, 1e9);
  constexpr double kBytes = 1e6, kHop = 1e-5;
  EXPECT_DOUBLE_EQ(sequential_heap(rate, rate, kBytes, kHop, 2), (kHop + kBytes / 1e9) + (kHop + kBytes / 0.5e9));
  const std::vector<double> seven(7, 1e9);
  EXPECT_THROW(sequential_heap(seven, seven, kBytes, kHop, 2), std::invalid_argument)
      << "position 2 has children: it must upload";
  EXPECT_NO_THROW(sequential_heap(seven, seven, kBytes, kHop, 3));
}

// Where a slow link sits: at a leaf it slows only the reduce (its upload); at an inner node
// the reduce and the broadcast (it forwards to its children); at the root only the broadcast.
TEST(TreeAllreduce, ASlowLinkCostsLeastAtALeafAndMostAtAnInnerNode) {
  constexpr double kBytes = 4e6, kHop = 5e-6, kFast = 1e9, kSlow = 1e8;
  const std::vector<double> ingress(7, kFast);
  const auto with_slow_at = [&](std::size_t position) {
    std::vector<double> egress(7, kFast);
    egress[position] = kSlow;
    return sequential_heap(egress, ingress, kBytes, kHop);
  };
  const double leaf = with_slow_at(6), inner = with_slow_at(1), root = with_slow_at(0);
  const double all_fast = sequential_heap(std::vector<double>(7, kFast), ingress, kBytes, kHop);
  EXPECT_GT(leaf, all_fast);
  EXPECT_GT(inner, leaf);
  EXPECT_GT(inner, root);
  // Pipelined, a leaf's upload at 1e8 bounds the reduce: at least bytes / 1e8, and the
  // broadcast at least bytes / (1e9 / 2).
  EXPECT_GE(leaf, kBytes / kSlow + kBytes / (kFast / 2));
  EXPECT_LT(leaf, 1.05 * (kBytes / kSlow + kBytes / (kFast / 2)));
}

// Overlapped, as NCCL runs a tree, a node's links carry the streams up and down at once: in a
// 7-node heap of rate r an inner node's egress carries three (one up, two down), so the
// pipeline runs at r / 3 over 4 edges, about 3 bytes / r with many chunks; sequential, the
// reduce and then the broadcast each run at r / 2: about 4 bytes / r.
TEST(TreeAllreduce, OverlappedPhasesShareEachLinkBetweenTheStreamsUpAndDown) {
  const std::vector<double> rate(7, 1e9);
  constexpr double kBytes = 8e6;
  const std::vector<std::size_t> heap = heap_tree(7);
  const double overlapped = tree_allreduce_seconds(heap, rate, rate, kBytes, 0.0, TreePhases::overlapped);
  const double sequential = tree_allreduce_seconds(heap, rate, rate, kBytes, 0.0, TreePhases::sequential);
  EXPECT_NEAR(overlapped, 3 * kBytes / 1e9, 0.002 * overlapped);
  EXPECT_NEAR(sequential, 4 * kBytes / 1e9, 0.002 * sequential);
  // A hop's cost is paid once per edge of the path and chunk: 2 x 2 edges overlapped.
  EXPECT_GT(tree_allreduce_seconds(heap, rate, rate, kBytes, 1e-3, TreePhases::overlapped), overlapped + 4e-3);
}

// The parents must form one tree, and only an uploader may have children.
TEST(TreeAllreduce, AnythingButOneTreeIsRefused) {
  const std::vector<double> rate(3, 1e9);
  constexpr std::size_t kNone = kRoot;
  for (const std::vector<std::size_t>& bad : {std::vector<std::size_t>{kNone, kNone, 0},  // two roots
                                              std::vector<std::size_t>{kNone, 2, 1},      // a cycle
                                              std::vector<std::size_t>{kNone, 0, 7},      // no such position
                                              std::vector<std::size_t>{kNone, 0}}) {      // one parent short
    EXPECT_THROW(tree_allreduce_seconds(bad, rate, rate, 1e6, 0.0), std::invalid_argument) << bad.size();
  }
  const std::vector<std::size_t> chain = {kNone, 0, 1};  // position 2 hangs below position 1
  EXPECT_NO_THROW(tree_allreduce_seconds(chain, rate, rate, 1e6, 0.0, TreePhases::overlapped, 2));
  EXPECT_THROW(tree_allreduce_seconds(chain, rate, rate, 1e6, 0.0, TreePhases::overlapped, 1), std::invalid_argument)
      << "position 1 does not upload but has a child";
}

// Egress 3, 3, 2, 1, 1, 1, 1, 1 (x r), fastest first, ingress ample. The largest rate a tree
// carries is 0.75 r: the root then feeds four children (4 x 0.75 = 3) and position 1 one stream
// up and three down (4 x 0.75 = 3); at any rate above it the first three positions have room
// for six children, not seven. A heap puts position 3 (egress r) inside, with a stream up and
// one down: r / 2.
TEST(TreeAllreduce, TheSchedulersShapeGivesEachWorkerTheChildrenItsEgressCarries) {
  constexpr double r = 1e9, kBytes = 8e6;
  const std::vector<double> egress = {3 * r, 3 * r, 2 * r, r, r, r, r, r}, ingress(8, 4 * r);
  const std::vector<std::size_t> shaped = rate_aware_tree(egress, ingress);
  EXPECT_EQ(shaped, (std::vector<std::size_t>{kRoot, 0, 0, 0, 0, 1, 1, 1}));
  const double t_shaped = tree_allreduce_seconds(shaped, egress, ingress, kBytes, 0.0, TreePhases::overlapped);
  const double t_heap = tree_allreduce_seconds(heap_tree(8), egress, ingress, kBytes, 0.0, TreePhases::overlapped);
  EXPECT_NEAR(t_shaped, kBytes / (0.75 * r), 0.002 * t_shaped);
  EXPECT_NEAR(t_heap, kBytes / (0.5 * r), 0.002 * t_heap);
  // Positions that do not upload stay leaves, and the rest still form one tree.
  const std::vector<std::size_t> five_upload = rate_aware_tree(egress, ingress, 5);
  for (std::size_t i = 1; i < 8; ++i) EXPECT_LT(five_upload[i], 5U) << "position " << i;
  EXPECT_NO_THROW(tree_allreduce_seconds(five_upload, egress, ingress, kBytes, 0.0, TreePhases::overlapped, 5));
  EXPECT_THROW(rate_aware_tree(egress, ingress, 0), std::invalid_argument) << "a root that does not upload";
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

// Shaped to the measured links, the scheduler's tree runs more rounds than its binary heap with
// the slowest at the leaves when the links are uneven (egress from 1/4 of the line rate to all
// of it) and hold: the heap gives every inner node two children whatever its egress.
TEST(TreeAllreduce, TheSchedulersShapedTreeRunsMoreRoundsThanItsHeap) {
  ClusterParams c = fifteen_workers(3);
  c.spread = 4;
  c.change_ms = 0;
  c.mode = Mode::gradlane_tree;
  c.skip_slowest = 3;
  c.tree_shape = TreeShape::heap;
  Cluster heap(c);
  c.tree_shape = TreeShape::rate_aware;
  Cluster shaped(c);
  heap.run_until(Instant{} + std::chrono::milliseconds(400));
  shaped.run_until(Instant{} + std::chrono::milliseconds(400));
  ASSERT_GE(heap.stats().steps, 3U);
  EXPECT_GT(shaped.stats().steps, heap.stats().steps);
  EXPECT_EQ(shaped.stats().applied, shaped.stats().steps * c.workers - shaped.stats().drops);
  c.tree_phases = TreePhases::sequential;
  EXPECT_TRUE(c.validate().has_value()) << "the shape is built for overlapped phases";
  c.tree_shape = TreeShape::heap;
  EXPECT_FALSE(c.validate().has_value());
}

// Adaptive: a ring until the links are measured, then the shaped tree while the links hold;
// when they change within every round (redrawn each 0.1 ms here), the tree overruns its
// prediction and the rounds go back to the ring.
TEST(TreeAllreduce, TheAdaptiveShapeTakesTheTreeWhileTheLinksHoldAndTheRingWhenTheyDoNot) {
  ClusterParams c = fifteen_workers(3);
  c.spread = 4;
  c.mode = Mode::gradlane_tree;
  c.skip_slowest = 3;
  c.change_ms = 0;
  Cluster steady(c);
  steady.run_until(Instant{} + std::chrono::milliseconds(400));
  ASSERT_GE(steady.stats().steps, 3U);
  EXPECT_EQ(steady.stats().rounds_by_ring, 1U) << "only the first, before any measurement";
  c.probe_bytes = 1 << 20;
  Cluster probed(c);
  probed.run_until(Instant{} + std::chrono::milliseconds(400));
  EXPECT_EQ(probed.stats().rounds_by_ring, 0U) << "the probe measured the links for the first round";
  EXPECT_EQ(probed.stats().drops, probed.stats().steps * 3) << "every round leaves 3 out, the first too";
  c.probe_bytes = 0;
  c.change_ms = 0.1;
  c.change_fraction = 1.0;
  Cluster churning(c);
  churning.run_until(Instant{} + std::chrono::milliseconds(400));
  const ClusterStats& s = churning.stats();
  ASSERT_GE(s.steps, 4U);
  EXPECT_GT(s.rounds_by_ring, s.steps / 2) << s.rounds_by_ring << " of " << s.steps;
  EXPECT_LT(s.rounds_by_ring, s.steps) << "the measured links proposed the tree at least once";
}

// Even links: the placement cannot matter, and a round is the H computes plus exactly the
// tree's price.
TEST(TreeAllreduce, WithEvenLinksARoundIsTheComputeThenTheTreesPrice) {
  ClusterParams c = fifteen_workers(0);
  c.mode = Mode::local_tree;
  Cluster tree(c);
  tree.run_until(Instant{} + std::chrono::milliseconds(100));
  const std::vector<double> rate(15, 80.0 * 1e9 / 8);
  const double allreduce =
      tree_allreduce_seconds(heap_tree(15), rate, rate, 8 << 20, c.ring_hop_us * 1e-6, TreePhases::overlapped);
  const double round_ms = 2.0 + allreduce * 1e3;
  ASSERT_GT(allreduce, 0.0);
  EXPECT_EQ(tree.stats().steps, static_cast<std::uint64_t>(100.0 / round_ms)) << round_ms << " ms a round";
}

}  // namespace
}  // namespace gradlane::sched::sim
