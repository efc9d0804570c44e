// ReplicaFollower: the replica's side of the server's decisions, against exact expectations.
#include "ps/server/replica_follower.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gradlane::ps {
namespace {

using namespace std::chrono_literals;
using Clock = ReplicaFollower::Clock;

// Drains `order`, each step as "a<sequence>" (applied) or "s<sequence>" (skipped).
std::string drain(ApplyOrder& order) {
  std::string steps;
  while (const auto step = order.next()) {
    steps += (step->kind == Step::Kind::apply ? "a" : "s") + std::to_string(step->sequence) + " ";
    EXPECT_TRUE(order.done(*step));
  }
  return steps;
}

TEST(ReplicaFollower, FeedsTheOrderAsTheServerDecidedOneSequenceAtATime) {
  ApplyOrder order(4);
  ReplicaFollower following;
  std::vector<std::uint64_t> fetched;
  const auto fetch = [&](std::uint64_t sequence) { fetched.push_back(sequence); };
  const auto now = Clock::now();
  following.mirror_rang(1, 2);
  following.mirror_rang(3, 1);
  EXPECT_EQ(following.feed(order, now, 1s, true, true, fetch), 0u) << "nothing decided yet: a mirror alone waits";
  following.decided({1, 2, 7});
  following.decided({2, 0, 0});  // skipped by the server
  following.decided({3, 1, 4});
  EXPECT_EQ(following.feed(order, now, 1s, true, true, fetch), 1u) << "one fed until it is applied";
  EXPECT_EQ(drain(order), "a1 ");
  EXPECT_EQ(following.feed(order, now, 1s, true, true, fetch), 1u);
  EXPECT_EQ(drain(order), "s2 ");
  EXPECT_EQ(following.feed(order, now, 1s, true, true, fetch), 1u);
  EXPECT_EQ(drain(order), "a3 ");
  EXPECT_TRUE(following.all_fed());
  EXPECT_TRUE(fetched.empty()) << "every applied update's mirror came";
  const auto first = following.take_fed(1);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->worker, 2u);
  EXPECT_EQ(first->tag, 7u);
  EXPECT_FALSE(following.take_fed(1).has_value()) << "taken once";
  EXPECT_EQ(following.take_fed(2)->worker, 0u) << "a skip is fed as decided";
}

TEST(ReplicaFollower, AnUpdateWhoseMirrorHasNotComeWaitsItsPatienceThenIsReadFromTheServer) {
  ApplyOrder order(4);
  ReplicaFollower following;
  std::vector<std::uint64_t> fetched;
  const auto fetch = [&](std::uint64_t sequence) { fetched.push_back(sequence); };
  const auto t0 = Clock::now();
  following.decided({1, 3, 0});
  EXPECT_EQ(following.feed(order, t0, 100ms, true, true, fetch), 0u);
  EXPECT_EQ(following.feed(order, t0 + 99ms, 100ms, true, true, fetch), 0u) << "its mirror may still come";
  EXPECT_EQ(following.feed(order, t0 + 100ms, 100ms, true, false, fetch), 0u) << "no server to read it from";
  EXPECT_TRUE(fetched.empty());
  EXPECT_EQ(following.feed(order, t0 + 100ms, 100ms, true, true, fetch), 1u);
  EXPECT_EQ(fetched, (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(drain(order), "a1 ");
  // The patience runs from when the head was first found waiting, for each head anew.
  following.decided({2, 3, 1});
  EXPECT_EQ(following.feed(order, t0 + 150ms, 100ms, true, true, fetch), 0u);
  EXPECT_EQ(following.feed(order, t0 + 249ms, 100ms, true, true, fetch), 0u);
  following.mirror_rang(2, 3);
  EXPECT_EQ(following.feed(order, t0 + 249ms, 100ms, true, true, fetch), 1u) << "its mirror came meanwhile";
  EXPECT_EQ(fetched.size(), 1u);
}

TEST(ReplicaFollower, NoMirrorIsAwaitedFromWorkersThatDoNotMirrorHere) {
  ReplicaFollower following;
  EXPECT_TRUE(following.mirror_coming({4, 3, 0}, true));
  EXPECT_FALSE(following.mirror_coming({4, 3, 0}, false)) << "workers told to let the replica read from the server";
  following.joined_running();
  EXPECT_FALSE(following.mirror_coming({4, 3, 0}, true)) << "joined running: worker 3 announced nothing";
  following.mirrors_from(3, 5);
  EXPECT_FALSE(following.mirror_coming({4, 3, 0}, true)) << "before the sequence it announced";
  EXPECT_TRUE(following.mirror_coming({5, 3, 0}, true));
  following.mirrors_stopped(3);
  EXPECT_FALSE(following.mirror_coming({5, 3, 0}, true)) << "a lost worker mirrors nothing more";

  ApplyOrder order(4);
  ReplicaFollower from_the_start;
  std::vector<std::uint64_t> fetched;
  from_the_start.decided({1, 3, 0});
  EXPECT_EQ(from_the_start.feed(order, Clock::now(), 1h, false, true, [&](std::uint64_t s) { fetched.push_back(s); }),
            1u)
      << "no mirror coming: read at once, not after the patience";
  EXPECT_EQ(fetched, (std::vector<std::uint64_t>{1}));
}

// A replica the workers started with: one whose connection here was lost goes on pushing to
// the server, and each of its updates is read from the server's slot at once, not after the
// patience (a job whose replica lost its workers crawled at one update per hole timeout).
TEST(ReplicaFollower, AWorkerLostHereMirrorsNothingMoreUntilItConnectsAgain) {
  ReplicaFollower following;
  following.mirrors_stopped(3);
  EXPECT_FALSE(following.mirror_coming({4, 3, 0}, true)) << "lost at a replica it started with";
  EXPECT_TRUE(following.mirror_coming({4, 2, 0}, true)) << "the other workers still mirror";
  following.mirrors_resumed(3);
  EXPECT_TRUE(following.mirror_coming({5, 3, 0}, true)) << "connected again";

  ApplyOrder order(4);
  std::vector<std::uint64_t> fetched;
  const auto fetch = [&](std::uint64_t s) { fetched.push_back(s); };
  following.mirrors_stopped(3);
  following.decided({1, 3, 0});
  EXPECT_EQ(following.feed(order, Clock::now(), 1h, true, true, fetch), 1u);
  EXPECT_EQ(fetched, (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(drain(order), "a1 ");
  following.joined_running();
  following.mirrors_resumed(3);
  EXPECT_FALSE(following.mirror_coming({6, 3, 0}, true)) << "joined running: not before it says from where";
}

TEST(ReplicaFollower, PromotedItTakesTheDecidedThenTheUndecidedMirrorsSkippingGapsUpToTheRingsEnd) {
  ApplyOrder order(8);
  ReplicaFollower following;
  following.decided({1, 1, 10});
  following.mirror_rang(1, 1);
  following.decided({2, 2, 20});  // applied by the server, its mirror never came: lost
  following.decided({3, 0, 0});   // skipped by the server
  following.mirror_rang(4, 1);    // acknowledged to worker 1, undecided
  following.mirror_rang(6, 2);    // behind a gap
  following.mirror_rang(12, 2);   // past the ring's end (sequences 1-8): lost
  const auto earlier_tag = [](std::uint32_t worker) -> std::optional<std::uint64_t> {
    if (worker == 2) return 41;
    return std::nullopt;
  };
  EXPECT_EQ(following.take_over(order, earlier_tag), 2u) << "sequences 2 and 12";
  EXPECT_EQ(drain(order), "a1 s2 s3 a4 s5 a6 s7 s8 ");
  EXPECT_TRUE(following.all_fed());
  EXPECT_FALSE(following.mirrored(12));
  const auto four = following.take_fed(4);
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(four->worker, 1u);
  EXPECT_EQ(four->tag, 11u) << "one past worker 1's decided tag";
  const auto six = following.take_fed(6);
  ASSERT_TRUE(six.has_value());
  EXPECT_EQ(six->tag, 42u) << "one past worker 2's tag in the history";
}

TEST(ReplicaFollower, PromotedItTagsAnUndecidedMirrorAsItsWorkerSaid) {
  // Worker 1's push tagged 11 was lost before the server decided it (its claim came too late),
  // so its next push, mirrored here and undecided, is its step 12: one past the decided tag is
  // wrong. A mirror whose worker said nothing gets one past that worker's last decided tag.
  ApplyOrder order(8);
  ReplicaFollower following;
  following.decided({1, 1, 10});
  following.mirror_rang(1, 1);
  following.mirror_rang(3, 1, 12);
  following.mirror_rang(4, 2);
  const auto none = [](std::uint32_t) -> std::optional<std::uint64_t> { return std::nullopt; };
  EXPECT_EQ(following.take_over(order, none), 0u);
  EXPECT_EQ(drain(order), "a1 s2 a3 a4 ");
  const auto three = following.take_fed(3);
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(three->tag, 12u) << "the tag worker 1 said, not one past its decided 10";
  const auto four = following.take_fed(4);
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(four->worker, 2u);
  EXPECT_EQ(four->tag, 0u) << "worker 2 said nothing for it and has no decided tag";
}

TEST(ReplicaFollower, EachAppliedSequenceIsAcknowledgedOnce) {
  ReplicaFollower following;
  following.acknowledged(5);  // joined running at version 5
  EXPECT_FALSE(following.ack_due(5).has_value());
  EXPECT_EQ(following.ack_due(7), 7u);
  EXPECT_FALSE(following.ack_due(7).has_value());
  EXPECT_FALSE(following.ack_due(6).has_value());
}

}  // namespace
}  // namespace gradlane::ps
