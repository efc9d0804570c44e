// The aggregator's member groups: the sum order depends only on who is in the group, the
// aggregate claims its oldest member's version, and a member slot is granted only when free.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "gradlane/error.hpp"
#include "ps/receiving/kernels.hpp"
#include "ps/aggregator/member_group.hpp"

namespace gradlane::ps {
namespace {

GroupMember member(std::uint64_t sequence, std::uint32_t worker, std::uint64_t tag, std::uint64_t computed_on) {
  GroupMember m;
  m.sequence = sequence;
  m.slot = static_cast<std::uint32_t>(sequence % 8);
  m.worker = worker;
  m.tag = tag;
  m.computed_on = computed_on;
  return m;
}

TEST(MemberGroup, FillsToItsSizeAndTakesInWorkerThenTagOrder) {
  MemberGroup group(4);
  EXPECT_TRUE(group.empty());
  EXPECT_EQ(group.first_sequence(), 0u);
  group.add(member(5, 3, 7, 10));
  group.add(member(6, 1, 9, 12));
  group.add(member(7, 3, 6, 11));
  EXPECT_FALSE(group.full());
  EXPECT_EQ(group.first_sequence(), 5u);
  group.add(member(9, 2, 1, 9));
  EXPECT_TRUE(group.full());
  EXPECT_THROW(group.add(member(10, 4, 0, 0)), Error);
  const auto taken = group.take();
  ASSERT_EQ(taken.size(), 4u);
  EXPECT_EQ(taken[0], member(6, 1, 9, 12));
  EXPECT_EQ(taken[1], member(9, 2, 1, 9));
  EXPECT_EQ(taken[2], member(7, 3, 6, 11));  // worker 3's tag 6 before its tag 7
  EXPECT_EQ(taken[3], member(5, 3, 7, 10));
  EXPECT_TRUE(group.empty());
  EXPECT_EQ(oldest_computed_on(taken), 9u);
}

TEST(MemberGroup, RefusesMembersOutOfSequenceOrderAndAnEmptySize) {
  EXPECT_THROW(MemberGroup(0), Error);
  MemberGroup group(3);
  group.add(member(4, 1, 0, 0));
  EXPECT_THROW(group.add(member(4, 2, 0, 0)), Error);
  EXPECT_THROW(group.add(member(3, 2, 0, 0)), Error);
  EXPECT_EQ(group.count(), 1u);
}

TEST(MemberGroup, TheSumOfAGroupIsTheSameWhateverOrderItsMembersArrived) {
  // The same eight members arriving in 50 random orders: the kernel's sum over sum_order() is
  // bitwise the same every time, and equal to a scalar left-to-right sum in that order. Values
  // of very different magnitudes make float addition visibly non-associative, so a sum in
  // arrival order would differ (checked: at least one shuffle gives different bits).
  constexpr std::size_t kFloats = 257;
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<float> value(-1.0F, 1.0F);
  std::vector<GroupMember> members;
  std::vector<std::vector<float>> data(8, std::vector<float>(kFloats));
  for (std::uint32_t i = 0; i < 8; ++i) {
    members.push_back(member(i + 1, 8 - i, i % 3, 100 + i));
    members.back().slot = i;
    const float scale = i % 2 == 0 ? 1e7F : 1e-3F;
    for (float& x : data[i]) x = value(rng) * scale;
  }
  auto sum = [&](const std::vector<GroupMember>& order) {
    std::vector<std::span<const float>> parts;
    for (const GroupMember& m : order) parts.push_back(data[m.slot]);
    std::vector<float> out(kFloats);
    sum_in_order(out, parts);
    return out;
  };
  const std::vector<GroupMember> fixed = sum_order(members);
  std::vector<float> scalar(kFloats, 0.0F);
  for (std::size_t j = 0; j < kFloats; ++j) {
    float acc = data[fixed[0].slot][j];
    for (std::size_t p = 1; p < fixed.size(); ++p) acc = acc + data[fixed[p].slot][j];
    scalar[j] = acc;
  }
  const std::vector<float> expected = sum(fixed);
  ASSERT_EQ(std::memcmp(expected.data(), scalar.data(), kFloats * sizeof(float)), 0);
  bool arrival_order_differs = false;
  for (int round = 0; round < 50; ++round) {
    // A new arrival order; the aggregator numbers members in the order it grants them.
    std::shuffle(members.begin(), members.end(), rng);
    MemberGroup group(8);
    for (std::size_t i = 0; i < members.size(); ++i) {
      GroupMember m = members[i];
      m.sequence = i + 1;
      group.add(m);
    }
    const std::vector<float> got = sum(group.take());
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), kFloats * sizeof(float)), 0) << "round " << round;
    const std::vector<float> in_arrival_order = sum(members);
    arrival_order_differs =
        arrival_order_differs || std::memcmp(in_arrival_order.data(), expected.data(), kFloats * sizeof(float)) != 0;
  }
  EXPECT_TRUE(arrival_order_differs) << "the data does not show float non-associativity; the test proves nothing";
}

TEST(MemberGroup, AMemberSlotIsFreeOnlyLessThanARingAheadOfTheOldestBusyOne) {
  EXPECT_TRUE(member_slot_free(1, 1, 8));
  EXPECT_TRUE(member_slot_free(8, 1, 8));
  EXPECT_FALSE(member_slot_free(9, 1, 8));  // slot 9 % 8 = 1 still holds sequence 1
  EXPECT_TRUE(member_slot_free(9, 2, 8));
  EXPECT_TRUE(oldest_computed_on({}) == 0u);
}

}  // namespace
}  // namespace gradlane::ps
