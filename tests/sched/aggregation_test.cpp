#include "sidecar/core/aggregation.hpp"

#include <gtest/gtest.h>

#include "sched_test_util.hpp"

namespace gradlane::sched {
namespace {

using testing::at_us;
using testing::ep;
using testing::kGBps;
using testing::us;

GroupCandidate waiting(std::uint32_t sender, Nanos direct, Version deadline = kNoDeadline, Instant ready = at_us(0)) {
  return GroupCandidate{sender, ep(sender), RequestId{sender}, 0, ready, 10 * kGBps, direct, deadline};
}

std::vector<std::uint32_t> senders(const std::vector<GroupCandidate>& members) {
  std::vector<std::uint32_t> v;
  for (const auto& m : members) v.push_back(to_int(m.sender));
  return v;
}

TEST(ChooseMembers, ShortestTransfersFirstUpToMaxGroup) {
  AggregationConfig c;
  c.max_group = 3;
  const auto m =
      choose_members(c, {waiting(5, us(50)), waiting(2, us(10)), waiting(9, us(10)), waiting(4, us(30))}, {}, 0);
  EXPECT_EQ(senders(m), (std::vector<std::uint32_t>{2, 9, 4}));
}

TEST(ChooseMembers, BelowMinGroupThereIsNoGroup) {
  AggregationConfig c;
  c.min_group = 3;
  EXPECT_TRUE(choose_members(c, {waiting(1, us(10)), waiting(2, us(10))}, {}, 0).empty());
}

TEST(ChooseMembers, LeavesOutTheStalestUntilTheDeadlineIsFeasible) {
  AggregationConfig c;
  DeadlineReservations reserved;
  reserved.insert(10, AggregateId{1});  // version 10 is taken by an earlier aggregate
  // Next grant is applied to version 10: a new aggregate gets version 11 at the earliest.
  const auto m =
      choose_members(c, {waiting(1, us(10), 10), waiting(2, us(10), 11), waiting(3, us(10), 12)}, reserved, 10);
  EXPECT_EQ(senders(m), (std::vector<std::uint32_t>{2, 3}));
  EXPECT_EQ(group_deadline(m), 11u);
  EXPECT_TRUE(choose_members(c, {waiting(1, us(10), 10), waiting(2, us(10), 11)}, reserved, 10).empty());
}

TEST(ChooseAggregator, PicksTheOneWhoseSumReachesTheServerFirst) {
  AggregationConfig c;  // sum_time 20 us
  const std::vector<GroupCandidate> members{waiting(1, us(100)), waiting(2, us(100))};
  const std::vector<AggregatorOption> options{
      {ep(50), at_us(0), at_us(0), 10 * kGBps, 10 * kGBps},
      {ep(60), at_us(0), at_us(0), 10 * kGBps, 20 * kGBps},  // forwards faster
  };
  // 1 MB members over 10 GB/s: [0,100) and [100,200), summed by 220; the server is free at 100.
  const auto plan = choose_aggregator(c, at_us(0), members, 1'000'000, options, at_us(100), 20 * kGBps);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->aggregator, ep(60));
  EXPECT_EQ(plan->member_slots, (std::vector<Slot>{{at_us(0), at_us(100)}, {at_us(100), at_us(200)}}));
  EXPECT_EQ(plan->sum_ready, at_us(220));
  EXPECT_EQ(plan->forward_time, us(50));
  EXPECT_EQ(plan->predicted_done, at_us(270));
}

TEST(ChooseAggregator, EqualOptionsGoToTheLowerId) {
  AggregationConfig c;
  const std::vector<GroupCandidate> members{waiting(1, us(100)), waiting(2, us(100))};
  const std::vector<AggregatorOption> options{
      {ep(70), at_us(0), at_us(0), 10 * kGBps, 10 * kGBps},
      {ep(60), at_us(0), at_us(0), 10 * kGBps, 10 * kGBps},
  };
  const auto plan = choose_aggregator(c, at_us(0), members, 1'000'000, options, at_us(100), 10 * kGBps);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->aggregator, ep(60));
}

TEST(ChooseAggregator, NoSpareBandwidthNoGroup) {
  AggregationConfig c;
  const std::vector<GroupCandidate> members{waiting(1, us(100)), waiting(2, us(100))};
  // Server free at 100 us would take both members by 300 us; a 2 GB/s aggregator needs 1 ms.
  const std::vector<AggregatorOption> slow{{ep(50), at_us(0), at_us(0), 2 * kGBps, 10 * kGBps}};
  EXPECT_FALSE(choose_aggregator(c, at_us(0), members, 1'000'000, slow, at_us(100), 10 * kGBps));
  // A busy aggregator (ingress booked until 250 us) has no spare bandwidth either.
  const std::vector<AggregatorOption> busy{{ep(50), at_us(250), at_us(0), 10 * kGBps, 10 * kGBps}};
  EXPECT_FALSE(choose_aggregator(c, at_us(0), members, 1'000'000, busy, at_us(100), 10 * kGBps));
}

TEST(ChooseAggregator, MembersArriveInReadyOrderAndWaitForTheirSender) {
  AggregationConfig c;
  const std::vector<GroupCandidate> members{waiting(1, us(100), kNoDeadline, at_us(150)),
                                            waiting(2, us(100), kNoDeadline, at_us(0))};
  const std::vector<AggregatorOption> options{{ep(50), at_us(0), at_us(0), 10 * kGBps, 10 * kGBps}};
  const auto plan = choose_aggregator(c, at_us(0), members, 1'000'000, options, at_us(300), 10 * kGBps);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(senders(plan->members), (std::vector<std::uint32_t>{2, 1}));
  EXPECT_EQ(plan->member_slots, (std::vector<Slot>{{at_us(0), at_us(100)}, {at_us(150), at_us(250)}}));
}

}  // namespace
}  // namespace gradlane::sched
