// Max-min fair sharing (perf/sched/fair_share.hpp), alone: the cluster simulator's fair network
// model rests on it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "perf/sched/fair_share.hpp"

namespace gradlane::sched::sim {
namespace {

constexpr double kTolerance = 1e-9;

std::vector<double> carried_per_link(const FairShare& share, const std::vector<double>& rates) {
  std::vector<double> sum(share.links(), 0.0);
  for (std::uint32_t f = 0; f < share.flows(); ++f) {
    for (const std::uint32_t link : share.links_of(f)) sum[link] += rates[f];
  }
  return sum;
}

// Max-min optimality: every flow crosses a saturated link on which no flow gets more than it
// (its bottleneck), so it could only get more by taking from a flow that has no more.
void expect_every_flow_bottlenecked(const FairShare& share, const std::vector<double>& rates) {
  const std::vector<double> carried = carried_per_link(share, rates);
  for (std::uint32_t f = 0; f < share.flows(); ++f) {
    bool bottlenecked = false;
    for (const std::uint32_t link : share.links_of(f)) {
      const bool saturated = carried[link] >= share.capacity(link) * (1 - kTolerance) - kTolerance;
      double largest = 0;
      for (std::uint32_t g = 0; g < share.flows(); ++g) {
        const auto links = share.links_of(g);
        if (std::find(links.begin(), links.end(), link) != links.end()) largest = std::max(largest, rates[g]);
      }
      if (saturated && rates[f] >= largest * (1 - kTolerance) - kTolerance) bottlenecked = true;
    }
    EXPECT_TRUE(bottlenecked) << "flow " << f << " at rate " << rates[f] << " has no bottleneck";
  }
}

TEST(FairShare, TwoFlowsOnOneLinkGetHalfEach) {
  FairShare share;
  const std::uint32_t link = share.add_link(10.0);
  share.add_flow({{link}});
  share.add_flow({{link}});
  const std::vector<double>& rates = share.solve();
  ASSERT_EQ(rates.size(), 2U);
  EXPECT_DOUBLE_EQ(rates[0], 5.0);
  EXPECT_DOUBLE_EQ(rates[1], 5.0);
}

TEST(FairShare, AFlowHeldBackByItsOwnEgressLeavesTheRestOfTheIngressToTheOthers) {
  // Three senders into one ingress of 10; the first sender's egress carries only 1.
  FairShare share;
  const std::uint32_t ingress = share.add_link(10.0);
  const std::uint32_t slow = share.add_link(1.0), fast_a = share.add_link(100.0), fast_b = share.add_link(100.0);
  share.add_flow({{slow, ingress}});
  share.add_flow({{fast_a, ingress}});
  share.add_flow({{fast_b, ingress}});
  const std::vector<double>& rates = share.solve();
  EXPECT_DOUBLE_EQ(rates[0], 1.0);
  // Max-min, not an equal split (10/3 each, leaving 7/3 of the ingress unused).
  EXPECT_DOUBLE_EQ(rates[1], 4.5);
  EXPECT_DOUBLE_EQ(rates[2], 4.5);
  expect_every_flow_bottlenecked(share, rates);
}

TEST(FairShare, ParkingLotGivesTheLongFlowItsShareOfTheTightestLink) {
  // Link 0 (cap 6) is crossed by flows 0 and 1; link 1 (cap 12) by flows 0 and 2.
  FairShare share;
  const std::uint32_t tight = share.add_link(6.0), wide = share.add_link(12.0);
  share.add_flow({{tight, wide}});
  share.add_flow({{tight}});
  share.add_flow({{wide}});
  const std::vector<double>& rates = share.solve();
  EXPECT_DOUBLE_EQ(rates[0], 3.0);
  EXPECT_DOUBLE_EQ(rates[1], 3.0);
  EXPECT_DOUBLE_EQ(rates[2], 9.0);
}

TEST(FairShare, RandomInstancesNeverOverfillALinkAndBottleneckEveryFlow) {
  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<double> capacity(0.1, 100.0);
  FairShare share;  // reused: clear() must leave nothing behind
  for (int instance = 0; instance < 300; ++instance) {
    share.clear();
    const auto links = std::uniform_int_distribution<std::uint32_t>(1, 12)(rng);
    for (std::uint32_t l = 0; l < links; ++l) share.add_link(capacity(rng));
    const auto flows = std::uniform_int_distribution<std::uint32_t>(1, 40)(rng);
    for (std::uint32_t f = 0; f < flows; ++f) {
      std::vector<std::uint32_t> all(links);
      for (std::uint32_t l = 0; l < links; ++l) all[l] = l;
      std::shuffle(all.begin(), all.end(), rng);
      const auto crossed = std::uniform_int_distribution<std::uint32_t>(1, std::min<std::uint32_t>(3, links))(rng);
      all.resize(crossed);
      share.add_flow(all);
    }
    const std::vector<double> rates = share.solve();
    ASSERT_EQ(rates.size(), flows);
    const std::vector<double> carried = carried_per_link(share, rates);
    for (std::uint32_t l = 0; l < links; ++l) {
      EXPECT_LE(carried[l], share.capacity(l) * (1 + kTolerance)) << "instance " << instance << " link " << l;
    }
    for (const double rate : rates) EXPECT_GT(rate, 0.0) << "instance " << instance;
    expect_every_flow_bottlenecked(share, rates);
    if (HasFailure()) return;
  }
}

TEST(FairShare, RefusesFlowsWithoutLinksUnknownOrRepeatedLinksAndBadCapacities) {
  FairShare share;
  const std::uint32_t link = share.add_link(1.0);
  EXPECT_THROW(share.add_flow({}), std::invalid_argument);
  EXPECT_THROW(share.add_flow({{link, link}}), std::invalid_argument);
  EXPECT_THROW(share.add_flow({{link + 1}}), std::invalid_argument);
  EXPECT_THROW(share.add_link(-1.0), std::invalid_argument);
  EXPECT_EQ(share.flows(), 0U);  // a refused flow leaves nothing half-added
  share.add_flow({{link}});
  EXPECT_DOUBLE_EQ(share.solve().at(0), 1.0);
}

}  // namespace
}  // namespace gradlane::sched::sim
