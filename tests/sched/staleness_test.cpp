#include "sidecar/core/staleness.hpp"

#include <gtest/gtest.h>

namespace gradlane::sched {
namespace {

TEST(Staleness, DelayIsVersionsAppliedInBetweenMinusOwnParts) {
  EXPECT_EQ(delay(10, 10, 0), 0u);  // computed on the latest model, applied next
  EXPECT_EQ(delay(13, 10, 0), 3u);
  EXPECT_EQ(delay(13, 10, 2), 1u);  // two of the 3 versions were this request's own parts
}

TEST(Staleness, DeadlineIsTheLastVersionWithinTau) {
  EXPECT_EQ(deadline(10, 0, 3), 13u);
  EXPECT_EQ(deadline(10, 2, 3), 15u);
  EXPECT_EQ(deadline(10, 0, 0), 10u);
  EXPECT_EQ(deadline(10, 0, std::nullopt), kNoDeadline);
  EXPECT_EQ(deadline(kNoDeadline - 1, 0, 5), kNoDeadline);  // saturates
}

TEST(DeadlineReservations, SlackIsTheTightestReservation) {
  DeadlineReservations r;
  EXPECT_TRUE(r.allows_other(100));
  r.insert(12, AggregateId{1});
  r.insert(11, AggregateId{2});
  // EDF: #2 applied to 10 (deadline 11: slack 1), #1 to 11 (deadline 12: slack 1).
  EXPECT_EQ(r.slack(10), 1u);
  EXPECT_TRUE(r.allows_other(10));
  EXPECT_EQ(r.slack(11), 0u);
  EXPECT_FALSE(r.allows_other(11));
  // At zero slack only the earliest deadline may go.
  EXPECT_TRUE(r.allows(AggregateId{2}, 11));
  EXPECT_FALSE(r.allows(AggregateId{1}, 11));
  r.erase(AggregateId{2});
  EXPECT_EQ(r.slack(12), 0u);
  EXPECT_TRUE(r.allows(AggregateId{1}, 12));
}

TEST(DeadlineReservations, FeasibilityOfANewReservation) {
  DeadlineReservations r;
  EXPECT_TRUE(r.feasible_with(10, 10));
  EXPECT_FALSE(r.feasible_with(10, 9));
  r.insert(10, AggregateId{1});
  EXPECT_FALSE(r.feasible_with(10, 10));  // two reservations cannot both have version 10
  EXPECT_TRUE(r.feasible_with(10, 11));
}

}  // namespace
}  // namespace gradlane::sched
