#include "sidecar/core/slot_book.hpp"

#include <gtest/gtest.h>

#include "sched_test_util.hpp"

namespace gradlane::sched {
namespace {

using testing::at_us;
using testing::us;

TEST(SlotBook, GrantsBackToBackNonOverlappingSlots) {
  SlotBook book;
  EXPECT_EQ(book.grant(at_us(0), us(10)), (Slot{at_us(0), at_us(10)}));
  // Asked to start earlier than the tail: starts at the tail.
  EXPECT_EQ(book.grant(at_us(5), us(10)), (Slot{at_us(10), at_us(20)}));
  // Asked to start later: leaves a gap, never back-filled.
  EXPECT_EQ(book.grant(at_us(30), us(5)), (Slot{at_us(30), at_us(35)}));
  EXPECT_EQ(book.grant(at_us(0), us(1)), (Slot{at_us(35), at_us(36)}));
  EXPECT_EQ(book.tail(), at_us(36));
  const auto slots = book.slots();
  ASSERT_EQ(slots.size(), 4u);
  for (std::size_t i = 1; i < slots.size(); ++i) EXPECT_FALSE(slots[i - 1].overlaps(slots[i]));
}

TEST(SlotBook, EarliestStartIsMaxOfAskAndTail) {
  SlotBook book;
  EXPECT_EQ(book.earliest_start(at_us(7)), at_us(7));
  book.grant(at_us(0), us(10));
  EXPECT_EQ(book.earliest_start(at_us(7)), at_us(10));
  EXPECT_EQ(book.earliest_start(at_us(12)), at_us(12));
}

TEST(SlotBook, ReserveAcceptsOnlySlotsAfterTheTail) {
  SlotBook book;
  EXPECT_TRUE(book.reserve(Slot{at_us(10), at_us(20)}));
  EXPECT_FALSE(book.reserve(Slot{at_us(15), at_us(25)}));  // overlaps
  EXPECT_FALSE(book.reserve(Slot{at_us(0), at_us(5)}));    // before the tail
  EXPECT_FALSE(book.reserve(Slot{at_us(30), at_us(25)}));  // malformed
  EXPECT_TRUE(book.reserve(Slot{at_us(20), at_us(25)}));
  EXPECT_EQ(book.tail(), at_us(25));
}

TEST(SlotBook, EarlyFinishOfTheLastSlotGivesTimeBack) {
  SlotBook book;
  const Slot a = book.grant(at_us(0), us(10));
  const Slot b = book.grant(at_us(0), us(10));
  EXPECT_FALSE(book.finish(a, at_us(4)));  // not the last slot: b is fixed after it
  EXPECT_EQ(book.tail(), at_us(20));
  EXPECT_TRUE(book.finish(b, at_us(13)));
  EXPECT_EQ(book.tail(), at_us(13));
  EXPECT_EQ(book.grant(at_us(0), us(2)), (Slot{at_us(13), at_us(15)}));
  // Finishing late or on time changes nothing.
  const Slot c = book.grant(at_us(0), us(5));
  EXPECT_FALSE(book.finish(c, at_us(40)));
  EXPECT_EQ(book.tail(), at_us(20));
}

TEST(SlotBook, FinishNeverMovesTheTailBeforeTheSlotStart) {
  SlotBook book;
  const Slot a = book.grant(at_us(10), us(10));
  EXPECT_TRUE(book.finish(a, at_us(3)));
  EXPECT_EQ(book.tail(), at_us(10));
}

TEST(SlotBook, RetireForgetsEndedSlotsButKeepsTheTail) {
  SlotBook book;
  for (int i = 0; i < 200; ++i) book.grant(at_us(0), us(1));
  book.retire_before(at_us(150));
  EXPECT_EQ(book.slots().size(), 50u);
  EXPECT_EQ(book.slots().front().start, at_us(150));
  EXPECT_EQ(book.tail(), at_us(200));
  book.retire_before(at_us(1000));
  EXPECT_TRUE(book.slots().empty());
  EXPECT_EQ(book.grant(at_us(0), us(1)).start, at_us(200));
}

}  // namespace
}  // namespace gradlane::sched
