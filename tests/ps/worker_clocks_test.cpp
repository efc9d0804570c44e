#include "ps/receiving/worker_clocks.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace gradlane::ps {
namespace {

TEST(WorkerClocks, TheSlowestIsZeroUntilEveryWorkerHasAnUpdateThenTheLeastStepsDone) {
  WorkerClocks clocks(3);
  EXPECT_FALSE(clocks.applied(1, 0));  // worker 1 did step 0; 2 and 3 nothing yet
  EXPECT_FALSE(clocks.applied(1, 1));
  EXPECT_FALSE(clocks.applied(2, 4));
  EXPECT_EQ(clocks.slowest(), 0U);
  EXPECT_TRUE(clocks.applied(3, 0));  // now each has one: min(2, 5, 1)
  EXPECT_EQ(clocks.slowest(), 1U);
  EXPECT_FALSE(clocks.applied(2, 5)) << "not the slowest: the slowest does not move";
  EXPECT_TRUE(clocks.applied(3, 6));  // min(2, 6, 7)
  EXPECT_EQ(clocks.slowest(), 2U);
  EXPECT_EQ(clocks.of(1), 2U);
  EXPECT_EQ(clocks.of(2), 6U);
  EXPECT_EQ(clocks.of(3), 7U);
}

TEST(WorkerClocks, TwoSlowestTiedMoveItOnlyWhenBothHaveMoved) {
  WorkerClocks clocks(2);
  (void)clocks.applied(1, 0);
  EXPECT_TRUE(clocks.applied(2, 0));
  EXPECT_EQ(clocks.slowest(), 1U);
  EXPECT_FALSE(clocks.applied(1, 3));
  EXPECT_EQ(clocks.slowest(), 1U);
  EXPECT_TRUE(clocks.applied(2, 1));
  EXPECT_EQ(clocks.slowest(), 2U);
}

TEST(WorkerClocks, WhatAPeerSendsCannotMoveAClockBackOrReachOutsideTheWorkers) {
  WorkerClocks clocks(2);
  (void)clocks.applied(1, 5);
  (void)clocks.applied(2, 5);
  ASSERT_EQ(clocks.slowest(), 6U);
  EXPECT_FALSE(clocks.applied(1, 2)) << "an older step applied late";
  EXPECT_EQ(clocks.of(1), 6U);
  EXPECT_FALSE(clocks.applied(0, 100)) << "id 0 is no worker";
  EXPECT_FALSE(clocks.applied(3, 100)) << "beyond the clocked workers";
  EXPECT_FALSE(clocks.applied(std::numeric_limits<std::uint32_t>::max(), 100));
  EXPECT_EQ(clocks.of(3), 0U);
  EXPECT_EQ(clocks.slowest(), 6U);
  constexpr auto kMax = std::numeric_limits<std::uint64_t>::max();
  EXPECT_FALSE(clocks.applied(1, kMax));
  EXPECT_EQ(clocks.of(1), kMax) << "saturates instead of wrapping to 0";
  EXPECT_TRUE(clocks.applied(2, kMax));
  EXPECT_EQ(clocks.slowest(), kMax);
}

}  // namespace
}  // namespace gradlane::ps
