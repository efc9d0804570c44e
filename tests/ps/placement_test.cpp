// Placement of a model's tensors on shard servers: balanced by size, deterministic, every
// tensor exactly once, shards contiguous.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "gradlane/ps.hpp"

namespace gradlane::ps {
namespace {

TEST(Placement, TheMlpsTensorsSpreadOverTwoServers) {
  // 784-256-10: W1, b1, W2, b2.
  const std::vector<std::size_t> tensors = {784 * 256, 256, 256 * 10, 10};
  const auto p = place_tensors(tensors, 2);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].server, 0u);  // the largest alone on server 0
  EXPECT_EQ(p[1].server, 1u);
  EXPECT_EQ(p[2].server, 1u);
  EXPECT_EQ(p[3].server, 1u);
  // Server 1 keeps the model's order: b1, W2, b2.
  EXPECT_EQ(p[1].offset, 0u);
  EXPECT_EQ(p[2].offset, 256u);
  EXPECT_EQ(p[3].offset, 256u + 2560u);
  EXPECT_EQ(shard_floats(p, 2), (std::vector<std::size_t>{784 * 256, 256 + 2560 + 10}));
}

TEST(Placement, RandomModelsAreCoveredOnceAndBalancedWithinOneTensor) {
  std::mt19937_64 rng(7);
  for (int run = 0; run < 500; ++run) {
    const std::uint32_t servers = 1 + static_cast<std::uint32_t>(rng() % 8);
    std::vector<std::size_t> tensors(1 + rng() % 40);
    for (auto& t : tensors) t = 1 + rng() % 100'000;
    const auto p = place_tensors(tensors, servers);
    const auto shards = shard_floats(p, servers);
    // Every float of every shard belongs to exactly one tensor.
    std::vector<std::vector<int>> covered(servers);
    for (std::uint32_t s = 0; s < servers; ++s) covered[s].assign(shards[s], 0);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      ASSERT_EQ(p[t].floats, tensors[t]);
      for (std::size_t k = 0; k < p[t].floats; ++k) ++covered[p[t].server][p[t].offset + k];
    }
    for (const auto& c : covered) {
      ASSERT_TRUE(std::all_of(c.begin(), c.end(), [](int n) { return n == 1; })) << "run " << run;
    }
    // Greedy largest-first: the fullest shard exceeds the emptiest by at most the largest tensor.
    const auto [lo, hi] = std::minmax_element(shards.begin(), shards.end());
    ASSERT_LE(*hi - *lo, *std::max_element(tensors.begin(), tensors.end())) << "run " << run;
    EXPECT_EQ(place_tensors(tensors, servers)[0].server, p[0].server) << "not deterministic";
  }
}

TEST(Placement, RefusesWhatCannotBePlaced) {
  const std::vector<std::size_t> none_empty = {10, 0};
  EXPECT_THROW(place_tensors(none_empty, 2), Error);
  const std::vector<std::size_t> ok = {10};
  EXPECT_THROW(place_tensors(ok, 0), Error);
}

}  // namespace
}  // namespace gradlane::ps
