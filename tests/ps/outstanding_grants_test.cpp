// A direct-mode granter's outstanding grants: a doorbell counts once and only for its own
// worker's sequence; silence past the hole timeout, or the worker's death, gives them back.
#include <gtest/gtest.h>

#include "ps/receiving/outstanding_grants.hpp"

namespace gradlane::ps {
namespace {

using namespace std::chrono_literals;
using Clock = OutstandingGrants::Clock;

TEST(OutstandingGrants, ADoorbellCountsOnceAndOnlyForAGrantedSequence) {
  OutstandingGrants grants;
  const Clock::time_point t0{};
  grants.add(3, t0);
  grants.add(5, t0);
  EXPECT_FALSE(grants.ring(4)) << "never granted to this worker";
  EXPECT_TRUE(grants.ring(3));
  EXPECT_FALSE(grants.ring(3)) << "a replayed doorbell";
  EXPECT_FALSE(grants.empty());
  EXPECT_TRUE(grants.ring(5));
  EXPECT_TRUE(grants.empty());
}

TEST(OutstandingGrants, SilencePastTheHoleTimeoutOrDeathGivesTheSequencesBackInOrder) {
  OutstandingGrants grants;
  const Clock::time_point t0{};
  grants.add(7, t0 + 10ms);
  grants.add(2, t0);
  grants.add(9, t0 + 20ms);
  EXPECT_FALSE(grants.any_expired(t0 + 99ms, 100ms));
  EXPECT_TRUE(grants.expire(t0 + 99ms, 100ms).empty());
  EXPECT_TRUE(grants.any_expired(t0 + 100ms, 100ms)) << "sequence 2, granted at t0, is due";
  EXPECT_TRUE(grants.any_expired(t0 + 100ms, 100ms)) << "asking removes nothing";
  EXPECT_EQ(grants.expire(t0 + 110ms, 100ms), (std::vector<std::uint64_t>{2, 7}));  // granted >= 100 ms ago
  EXPECT_FALSE(grants.ring(2)) << "an expired sequence is a hole: its late doorbell is refused";
  grants.add(11, t0 + 200ms);
  EXPECT_EQ(grants.take_all(), (std::vector<std::uint64_t>{9, 11}));
  EXPECT_TRUE(grants.empty());
}

}  // namespace
}  // namespace gradlane::ps
