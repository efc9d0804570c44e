// AggregateBook: the sidecar-mode aggregator's pairing of redirected members with aggregate
// grants (ps/aggregator/aggregate_book.hpp). Exact expectations over hand-made sequences.
#include "ps/aggregator/aggregate_book.hpp"

#include <gtest/gtest.h>

#include "gradlane/error.hpp"

namespace gradlane::ps {
namespace {

using namespace std::chrono_literals;
using Instant = AggregateBook::Instant;

const Instant t0{std::chrono::seconds(100)};

TEST(AggregateBook, MembersBeforeTheGrantAreDueWhenAllCameInWorkerOrder) {
  AggregateBook book(3, 4);
  EXPECT_EQ(book.arrived(2, 30, 7, t0), Arrival::accepted);
  EXPECT_EQ(book.arrived(0, 10, 7, t0), Arrival::accepted);
  EXPECT_TRUE(book.take_due(t0 + 1h).empty());  // no grant yet: nothing is due, however late
  ASSERT_TRUE(book.granted(7, 55, 3, 5ms, t0 + 1s));
  EXPECT_TRUE(book.take_due(t0).empty());  // 2 of 3 members, before the give-up time
  EXPECT_EQ(book.arrived(1, 20, 7, t0), Arrival::accepted);
  const auto due = book.take_due(t0);
  ASSERT_EQ(due.size(), 1U);
  EXPECT_EQ(due[0].aggregate, 7U);
  EXPECT_EQ(due[0].sequence, 55U);
  EXPECT_EQ(due[0].expected, 3U);
  EXPECT_EQ(due[0].slot_start, 5ms);
  ASSERT_EQ(due[0].members.size(), 3U);
  EXPECT_EQ(due[0].members[0], (BookedMember{0, 10, 3}));  // 7 % 4 = slot 3, sorted by worker
  EXPECT_EQ(due[0].members[1], (BookedMember{1, 20, 3}));
  EXPECT_EQ(due[0].members[2], (BookedMember{2, 30, 3}));
  EXPECT_EQ(book.ring_slot(due[0].members[2]), 2U * 4U + 3U);
  EXPECT_TRUE(book.empty());
}

TEST(AggregateBook, AMissingMemberIsLeftOutAtTheGiveUpTimeAndNoMemberMeansCancel) {
  AggregateBook book(2, 4);
  ASSERT_TRUE(book.granted(1, 10, 2, 0ns, t0 + 1s));
  ASSERT_TRUE(book.granted(2, 11, 2, 0ns, t0 + 2s));
  EXPECT_EQ(book.arrived(0, 1, 1, t0), Arrival::accepted);
  EXPECT_TRUE(book.take_due(t0 + 999ms).empty());
  auto due = book.take_due(t0 + 1s);
  ASSERT_EQ(due.size(), 1U);
  EXPECT_EQ(due[0].sequence, 10U);
  EXPECT_EQ(due[0].members.size(), 1U);
  due = book.take_due(t0 + 2s);
  ASSERT_EQ(due.size(), 1U);
  EXPECT_EQ(due[0].sequence, 11U);
  EXPECT_TRUE(due[0].members.empty());  // the caller completes it as failed
  EXPECT_TRUE(book.empty());
}

TEST(AggregateBook, ARepeatedDoorbellIsRefusedAndASecondGrantIgnored) {
  AggregateBook book(1, 4);
  EXPECT_EQ(book.arrived(0, 1, 9, t0), Arrival::accepted);
  EXPECT_EQ(book.arrived(0, 1, 9, t0), Arrival::duplicate);
  EXPECT_TRUE(book.granted(9, 3, 2, 0ns, t0 + 1s));
  EXPECT_FALSE(book.granted(9, 4, 1, 0ns, t0 + 1s));
  const auto due = book.take_due(t0 + 1s);
  ASSERT_EQ(due.size(), 1U);
  EXPECT_EQ(due[0].sequence, 3U);
  EXPECT_EQ(due[0].members.size(), 1U);  // the duplicate did not count as the second member
}

TEST(AggregateBook, ReusingASlotStillHeldStrikesTheOlderMember) {
  AggregateBook book(1, 4);
  EXPECT_EQ(book.arrived(0, 1, 2, t0), Arrival::accepted);   // aggregate 2: slot 2
  EXPECT_EQ(book.arrived(0, 1, 6, t0), Arrival::displaced);  // aggregate 6: slot 2 again
  ASSERT_TRUE(book.granted(2, 20, 1, 0ns, t0 + 1s));
  ASSERT_TRUE(book.granted(6, 21, 1, 0ns, t0 + 1s));
  auto due = book.take_due(t0);
  ASSERT_EQ(due.size(), 1U);  // 6 is complete; 2 lost its member and waits for its give-up
  EXPECT_EQ(due[0].sequence, 21U);
  due = book.take_due(t0 + 1s);
  ASSERT_EQ(due.size(), 1U);
  EXPECT_EQ(due[0].sequence, 20U);
  EXPECT_TRUE(due[0].members.empty());
}

TEST(AggregateBook, ASlotIsFreeAgainOnceItsAggregateWasTaken) {
  AggregateBook book(1, 2);
  EXPECT_EQ(book.arrived(0, 1, 1, t0), Arrival::accepted);
  ASSERT_TRUE(book.granted(1, 1, 1, 0ns, t0 + 1s));
  ASSERT_EQ(book.take_due(t0).size(), 1U);
  EXPECT_EQ(book.arrived(0, 1, 3, t0), Arrival::accepted);  // slot 1 again, not displaced
}

TEST(AggregateBook, UngrantedMembersExpireAndFreeTheirSlots) {
  AggregateBook book(2, 2);
  EXPECT_EQ(book.arrived(0, 1, 4, t0), Arrival::accepted);
  EXPECT_EQ(book.arrived(1, 2, 4, t0 + 1s), Arrival::accepted);
  EXPECT_EQ(book.expire_ungranted(t0 + 29s, 30s), 0U);
  EXPECT_EQ(book.expire_ungranted(t0 + 30s, 30s), 2U);  // timed from the first member
  EXPECT_TRUE(book.empty());
  EXPECT_EQ(book.arrived(0, 1, 6, t0 + 31s), Arrival::accepted);  // slot 0 free again
}

TEST(AggregateBook, RefusesAnEmptyGeometryAndAnUnknownPeer) {
  EXPECT_THROW(AggregateBook(0, 4), Error);
  EXPECT_THROW(AggregateBook(4, 0), Error);
  AggregateBook book(2, 2);
  EXPECT_THROW((void)book.arrived(2, 1, 1, t0), Error);
}

}  // namespace
}  // namespace gradlane::ps
