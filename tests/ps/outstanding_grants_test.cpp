// A direct-mode granter's outstanding grants: a doorbell counts once and only for its own
// worker's sequence; silence past the hole timeout, or the worker's death, gives them back.
#include <gtest/gtest.h>

#include <cstddef>
#include <utility>
#include <string>
#include <vector>

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

struct PeerWithGrants {
  OutstandingGrants outstanding;
  bool alive = true;
};

// Which of slots 0..3 `held` holds, as a string: "x" held, "." free.
std::string held_of_four(const HeldSlots& held) {
  std::string slots;
  for (std::uint64_t sequence = 0; sequence < 4; ++sequence) slots += held.holds(sequence) ? 'x' : '.';
  return slots;
}

TEST(HeldSlots, AHoleHoldsItsSlotUntilItsWorkerAsksAgainOrIsGone) {
  std::vector<PeerWithGrants> peers(3);
  EXPECT_EQ(held_of_four(HeldSlots(peers, 4)), "....") << "no hole: nothing held";
  peers[0].outstanding.may_still_land(5);  // slot 1
  peers[1].outstanding.may_still_land(7);  // slot 3
  peers[1].outstanding.may_still_land(8);  // slot 0
  EXPECT_EQ(held_of_four(HeldSlots(peers, 4)), "xx.x");
  EXPECT_TRUE(HeldSlots(peers, 4).holds(13)) << "sequence 13 reuses slot 1";
  EXPECT_FALSE(HeldSlots(peers, 4).all());
  peers[2].outstanding.may_still_land(10);  // slot 2
  EXPECT_TRUE(HeldSlots(peers, 4).all());
  peers[2].outstanding.asked_again();
  peers[1].outstanding.asked_again();
  EXPECT_EQ(held_of_four(HeldSlots(peers, 4)), ".x..") << "workers 1 and 2 asked again: their earlier writes are in";
  peers[0].alive = false;
  EXPECT_EQ(held_of_four(HeldSlots(peers, 4)), "....") << "worker 0's connection is closed: nothing of it lands";
  EXPECT_FALSE(HeldSlots(peers, 4).all()) << "nothing held is not all held";
}

TEST(ExpireHoles, TheDoorbellsThatLandedMeanwhileAreTakenBeforeAnyGrantIsCalledAHole) {
  std::vector<PeerWithGrants> peers(2);
  const auto long_ago = Clock::now() - 1s;
  peers[0].outstanding.add(4, long_ago);
  peers[0].outstanding.add(6, long_ago);
  peers[1].outstanding.add(5, long_ago);
  peers[1].outstanding.add(8, Clock::now() + 1h);  // not due
  std::vector<std::pair<std::size_t, std::uint64_t>> holes;
  const std::size_t work = expire_holes(
      peers, 100ms,
      [&] {
        EXPECT_TRUE(holes.empty()) << "looked again only before the holes";
        EXPECT_TRUE(peers[0].outstanding.ring(6));  // its write landed while the granter slept
        return std::size_t{1};
      },
      [&](PeerWithGrants& peer, std::uint64_t sequence) { holes.emplace_back(&peer - peers.data(), sequence); });
  EXPECT_EQ(holes, (std::vector<std::pair<std::size_t, std::uint64_t>>{{0, 4}, {1, 5}}));
  EXPECT_EQ(work, 3U) << "the look again's work and one per hole";
  EXPECT_FALSE(peers[1].outstanding.empty()) << "sequence 8 is not due";
}

TEST(ExpireHoles, NothingDueLooksNoFurther) {
  std::vector<PeerWithGrants> peers(1);
  int looked = 0;
  const auto look = [&] { return static_cast<std::size_t>(++looked); };
  const auto hole = [](PeerWithGrants&, std::uint64_t) { ADD_FAILURE() << "no grant is due"; };
  EXPECT_EQ(expire_holes(peers, 100ms, look, hole), 0U) << "nothing outstanding";
  peers[0].outstanding.add(3, Clock::now());
  EXPECT_EQ(expire_holes(peers, 1h, look, hole), 0U) << "outstanding, not due";
  EXPECT_EQ(looked, 0);
}

}  // namespace
}  // namespace gradlane::ps
