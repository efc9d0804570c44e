#include "sidecar/core/ingress_shares.hpp"

#include <gtest/gtest.h>

#include "sched_test_util.hpp"

namespace gradlane::sched {
namespace {

using testing::at_us;

Slot slot(std::int64_t from_us, std::int64_t to_us) { return Slot{at_us(from_us), at_us(to_us)}; }

TEST(IngressShares, SharesThatFitStartTogetherAndTheNextWaitsForTheFirstEnd) {
  IngressShares in;
  EXPECT_TRUE(in.book(slot(0, 40), 0.25));
  EXPECT_TRUE(in.book(slot(0, 10), 0.5));
  EXPECT_EQ(in.earliest(at_us(0), 0.25), at_us(0));  // exactly 1 in use: fits
  EXPECT_TRUE(in.book(slot(0, 20), 0.25));
  EXPECT_DOUBLE_EQ(in.used_at(at_us(0)), 1.0);
  // Full until the half-share booking ends at 10; a 0.75 share waits for the next end too.
  EXPECT_EQ(in.earliest(at_us(0), 0.5), at_us(10));
  EXPECT_EQ(in.earliest(at_us(0), 0.75), at_us(20));
  EXPECT_EQ(in.earliest(at_us(0), 1.0), at_us(40));
  EXPECT_EQ(in.earliest(at_us(25), 0.75), at_us(25));
}

TEST(IngressShares, RefusesABookingThatWouldOverfillTheLineOrStartBeforeTheLast) {
  IngressShares in;
  ASSERT_TRUE(in.book(slot(5, 50), 0.6));
  EXPECT_FALSE(in.book(slot(5, 50), 0.6));   // 1.2 of the line
  EXPECT_FALSE(in.book(slot(0, 50), 0.1));   // before the last start: starts follow sequence order
  EXPECT_FALSE(in.book(slot(20, 10), 0.1));  // malformed
  EXPECT_TRUE(in.book(slot(5, 30), 0.4));
  EXPECT_EQ(in.floor(), at_us(5));
  EXPECT_EQ(in.bookings().size(), 2u);
}

TEST(IngressShares, AnEarlyFinishFreesItsShareFromThenOn) {
  IngressShares in;
  ASSERT_TRUE(in.book(slot(0, 100), 1.0));
  EXPECT_EQ(in.earliest(at_us(0), 0.5), at_us(100));
  EXPECT_TRUE(in.finish(slot(0, 100), at_us(30)));
  EXPECT_EQ(in.earliest(at_us(0), 0.5), at_us(30));
  EXPECT_FALSE(in.finish(slot(0, 100), at_us(10)));  // no such booking any more
  in.retire_before(at_us(30));
  EXPECT_TRUE(in.bookings().empty());
  EXPECT_EQ(in.floor(), at_us(0));  // retiring never lets a later booking start earlier
}

TEST(IngressShares, ShareIsClampedIntoTheLine) {
  EXPECT_DOUBLE_EQ(IngressShares::clamp(4.0), 1.0);
  EXPECT_GT(IngressShares::clamp(0.0), 0.0);
  EXPECT_GT(IngressShares::clamp(std::numeric_limits<double>::quiet_NaN()), 0.0);
}

}  // namespace
}  // namespace gradlane::sched
