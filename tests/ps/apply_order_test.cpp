// ApplyOrder: exact expectations for in-order and out-of-order arrival, cancelled holes,
// every refusal reason, and the widening of 32-bit doorbell immediates.
#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <string_view>
#include <vector>

#include "gradlane/error.hpp"
#include "ps/receiving/apply_order.hpp"

namespace gradlane::ps {
namespace {

using Kind = Step::Kind;

// Applies (or skips) everything ready, in order, and returns the steps taken.
std::vector<Step> drain(ApplyOrder& order) {
  std::vector<Step> steps;
  while (const std::optional<Step> step = order.next()) {
    EXPECT_TRUE(order.done(*step));
    steps.push_back(*step);
  }
  return steps;
}

void expect_progress(const ApplyOrder& order, std::uint64_t next, std::uint64_t applied, std::uint64_t skipped) {
  EXPECT_EQ(order.next_sequence(), next);
  EXPECT_EQ(order.applied(), applied);
  EXPECT_EQ(order.skipped(), skipped);
}

TEST(ApplyOrder, InOrderArrivalsApplyAsTheyCome) {
  ApplyOrder order(4);
  EXPECT_FALSE(order.next());
  for (std::uint64_t s = 1; s <= 10; ++s) {
    const auto slot = static_cast<std::uint32_t>((s - 1) % 4);
    ASSERT_EQ(order.arrived(s, slot), Admit::accepted);
    EXPECT_EQ(order.pending(), 1u);
    EXPECT_EQ(drain(order), (std::vector<Step>{{s, Kind::apply, slot}}));
  }
  expect_progress(order, 11, 10, 0);
  EXPECT_EQ(order.pending(), 0u);
  EXPECT_EQ(order.refused_total(), 0u);
}

TEST(ApplyOrder, OutOfOrderArrivalsWaitForTheGapThenApplyInOrder) {
  ApplyOrder order(4);
  EXPECT_EQ(order.arrived(3, 2), Admit::accepted);
  EXPECT_EQ(order.arrived(2, 0), Admit::accepted);
  EXPECT_FALSE(order.next());  // 1 is missing
  EXPECT_EQ(order.pending(), 2u);
  EXPECT_EQ(order.arrived(1, 3), Admit::accepted);
  EXPECT_EQ(drain(order), (std::vector<Step>{{1, Kind::apply, 3}, {2, Kind::apply, 0}, {3, Kind::apply, 2}}));
  expect_progress(order, 4, 3, 0);
}

TEST(ApplyOrder, WouldAdmitAnswersAsArrivedWouldAndChangesNothing) {
  // A server opens a slot to a claimant only while an arrival would be admitted.
  ApplyOrder order(4);
  ASSERT_EQ(order.arrived(2, 2), Admit::accepted);
  ASSERT_EQ(order.cancelled(3), Admit::accepted);
  EXPECT_EQ(order.would_admit(1, 1), Admit::accepted);
  EXPECT_EQ(order.would_admit(2, 2), Admit::duplicate);
  EXPECT_EQ(order.would_admit(3, 3), Admit::already_cancelled);
  EXPECT_EQ(order.would_admit(4, 2), Admit::slot_busy);  // slot 2 holds sequence 2
  EXPECT_EQ(order.would_admit(5, 1), Admit::beyond_window);
  EXPECT_EQ(order.would_admit(1, 4), Admit::slot_out_of_range);
  EXPECT_EQ(order.refused_total(), 0u) << "a question is not a refusal";
  EXPECT_EQ(order.pending(), 2u);
  ASSERT_EQ(order.arrived(1, 1), Admit::accepted);
  EXPECT_EQ(drain(order), (std::vector<Step>{{1, Kind::apply, 1}, {2, Kind::apply, 2}, {3, Kind::skip, 0}}));
  EXPECT_EQ(order.would_admit(1, 1), Admit::already_done);
  EXPECT_EQ(order.would_admit(4, 2), Admit::accepted) << "slot 2 is free once sequence 2 is applied";
}

TEST(ApplyOrder, NextIsAPeekUntilDone) {
  ApplyOrder order(2);
  ASSERT_EQ(order.arrived(1, 1), Admit::accepted);
  const Step step{1, Kind::apply, 1};
  EXPECT_EQ(order.next(), step);
  EXPECT_EQ(order.next(), step);
  EXPECT_EQ(order.next_sequence(), 1u);
  // The slot is still being read: sequence 2 may not land in it yet.
  EXPECT_EQ(order.arrived(2, 1), Admit::slot_busy);
  EXPECT_FALSE(order.done(Step{1, Kind::apply, 0}));  // not the step next() gave
  EXPECT_FALSE(order.done(Step{1, Kind::skip, 0}));
  EXPECT_FALSE(order.done(Step{2, Kind::apply, 1}));
  EXPECT_EQ(order.next_sequence(), 1u);
  EXPECT_TRUE(order.done(step));
  EXPECT_FALSE(order.done(step));  // twice
  EXPECT_EQ(order.arrived(2, 1), Admit::accepted);
}

TEST(ApplyOrder, CancelledHolesAreSkippedInOrder) {
  ApplyOrder order(8, 5);
  EXPECT_EQ(order.arrived(7, 0), Admit::accepted);
  EXPECT_EQ(order.cancelled(6), Admit::accepted);
  EXPECT_FALSE(order.next());
  EXPECT_EQ(order.cancelled(5), Admit::accepted);
  EXPECT_EQ(order.pending(), 3u);
  EXPECT_EQ(drain(order), (std::vector<Step>{{5, Kind::skip, 0}, {6, Kind::skip, 0}, {7, Kind::apply, 0}}));
  expect_progress(order, 8, 1, 2);
}

TEST(ApplyOrder, EveryRefusalIsCountedAndChangesNothing) {
  ApplyOrder order(4);
  ASSERT_EQ(order.arrived(1, 0), Admit::accepted);
  ASSERT_TRUE(order.done(*order.next()));
  ASSERT_EQ(order.arrived(2, 1), Admit::accepted);
  ASSERT_EQ(order.cancelled(3), Admit::accepted);
  const auto before = order.next();

  EXPECT_EQ(order.arrived(1, 2), Admit::already_done);
  EXPECT_EQ(order.cancelled(1), Admit::already_done);
  EXPECT_EQ(order.arrived(6, 2), Admit::beyond_window);  // window is [2, 6)
  EXPECT_EQ(order.cancelled(6), Admit::beyond_window);
  EXPECT_EQ(order.arrived(std::numeric_limits<std::uint64_t>::max(), 2), Admit::beyond_window);
  EXPECT_EQ(order.arrived(2, 1), Admit::duplicate);
  EXPECT_EQ(order.arrived(2, 2), Admit::duplicate);
  EXPECT_EQ(order.cancelled(3), Admit::duplicate);
  EXPECT_EQ(order.arrived(4, 4), Admit::slot_out_of_range);
  EXPECT_EQ(order.arrived(4, 1), Admit::slot_busy);
  EXPECT_EQ(order.arrived(3, 2), Admit::already_cancelled);
  EXPECT_EQ(order.cancelled(2), Admit::already_arrived);

  EXPECT_EQ(order.refused(Admit::already_done), 2u);
  EXPECT_EQ(order.refused(Admit::beyond_window), 3u);
  EXPECT_EQ(order.refused(Admit::duplicate), 3u);
  EXPECT_EQ(order.refused(Admit::slot_out_of_range), 1u);
  EXPECT_EQ(order.refused(Admit::slot_busy), 1u);
  EXPECT_EQ(order.refused(Admit::already_cancelled), 1u);
  EXPECT_EQ(order.refused(Admit::already_arrived), 1u);
  EXPECT_EQ(order.refused(Admit::accepted), 0u);
  EXPECT_EQ(order.refused_total(), 12u);

  EXPECT_EQ(order.next(), before);
  EXPECT_EQ(order.pending(), 2u);
  EXPECT_EQ(drain(order), (std::vector<Step>{{2, Kind::apply, 1}, {3, Kind::skip, 0}}));
  // The refused sequences 4 and 5 never entered: the window's end is free.
  EXPECT_EQ(order.arrived(4, 1), Admit::accepted);
  EXPECT_EQ(order.arrived(7, 2), Admit::accepted);
  EXPECT_EQ(order.arrived(8, 3), Admit::beyond_window);  // window is [4, 8)
}

TEST(ApplyOrder, TheWindowEdgeMovesWithDone) {
  ApplyOrder order(3);
  EXPECT_EQ(order.arrived(3, 2), Admit::accepted);
  EXPECT_EQ(order.arrived(4, 0), Admit::beyond_window);
  ASSERT_EQ(order.cancelled(1), Admit::accepted);
  ASSERT_TRUE(order.done(*order.next()));
  EXPECT_EQ(order.arrived(4, 0), Admit::accepted);
}

TEST(ApplyOrder, RefusesAnUnusableConstruction) {
  EXPECT_THROW(ApplyOrder(0), Error);
  EXPECT_THROW(ApplyOrder(4, 0), Error);
}

TEST(ApplyOrder, AdmitNamesAreDistinct) {
  std::set<std::string_view> names;
  for (std::size_t a = 0; a < kAdmitCount; ++a) names.insert(admit_name(static_cast<Admit>(a)));
  EXPECT_EQ(names.size(), kAdmitCount);
  EXPECT_EQ(names.count("unknown"), 0u);
}

TEST(ApplyOrderWiden, RecoversSequencesNearTheReference) {
  EXPECT_EQ(ApplyOrder::widen(1, 1), 1u);
  EXPECT_EQ(ApplyOrder::widen(5, 1), 5u);
  EXPECT_EQ(ApplyOrder::widen(1000, 1010), 1000u);  // a late doorbell, below the reference
}

TEST(ApplyOrderWiden, CrossesThe32BitBoundaryBothWays) {
  constexpr std::uint64_t k32 = std::uint64_t{1} << 32;
  // Reference just below 2^32, sequence just above: the immediate has wrapped to small.
  EXPECT_EQ(ApplyOrder::widen(2, k32 - 3), k32 + 2);
  EXPECT_EQ(ApplyOrder::widen(0, k32 - 1), k32);
  // Reference just above, a late doorbell from just below.
  EXPECT_EQ(ApplyOrder::widen(0xFFFFFFFFu, k32 + 1), k32 - 1);
  // Far from zero, across the n-th wrap.
  const std::uint64_t ref = 7 * k32 - 10;
  for (std::uint64_t s = ref - 100; s < ref + 100; ++s) {
    EXPECT_EQ(ApplyOrder::widen(static_cast<std::uint32_t>(s), ref), s) << s;
  }
}

TEST(ApplyOrderWiden, NearestWithinHalfTheImmediateRange) {
  constexpr std::uint64_t k31 = std::uint64_t{1} << 31;
  const std::uint64_t ref = 5 * (k31 << 1) + 12345;
  EXPECT_EQ(ApplyOrder::widen(static_cast<std::uint32_t>(ref + k31 - 1), ref), ref + k31 - 1);
  EXPECT_EQ(ApplyOrder::widen(static_cast<std::uint32_t>(ref - k31), ref), ref - k31);
  // ref + 2^31 has the same low bits as ref - 2^31: the rule picks the one below.
  EXPECT_EQ(ApplyOrder::widen(static_cast<std::uint32_t>(ref + k31), ref), ref - k31);
}

TEST(ApplyOrderWiden, NeverBelowZero) {
  // Near zero the candidate below would be negative; the one above is returned (then refused
  // as beyond the window by arrived()).
  EXPECT_EQ(ApplyOrder::widen(0xFFFFFFFFu, 1), 0xFFFFFFFFu);
  EXPECT_EQ(ApplyOrder::widen(0, 0), 0u);
  ApplyOrder order(4);
  EXPECT_EQ(order.arrived(ApplyOrder::widen(0xFFFFFFFFu, order.next_sequence()), 0), Admit::beyond_window);
}

}  // namespace
}  // namespace gradlane::ps
