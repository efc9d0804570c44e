// The sidecar-mode aggregator's ring partitions (ps/aggregator/partition_pool.hpp) and the book's
// answer to "is any of this worker's member slots still held" (AggregateBook::holds_any).
#include <gtest/gtest.h>

#include <optional>

#include "gradlane/error.hpp"
#include "ps/aggregator/aggregate_book.hpp"
#include "ps/aggregator/partition_pool.hpp"

namespace gradlane::ps {
namespace {

TEST(PartitionPool, HandsEachConnectionItsOwnUntilGivenBackThenTheLongestFreeFirst) {
  PartitionPool pool(3);
  EXPECT_EQ(pool.take(), 0u);
  EXPECT_EQ(pool.take(), 1u);
  EXPECT_EQ(pool.take(), 2u);
  EXPECT_EQ(pool.take(), std::nullopt) << "three connections hold all three";
  EXPECT_EQ(pool.advertised(), 4u);
  EXPECT_THROW(pool.partition_of(3), Error) << "the fourth connection got none";
  pool.give_back(1);
  pool.give_back(0);
  EXPECT_THROW(pool.give_back(0), Error) << "given back twice";
  EXPECT_THROW(pool.give_back(7), Error);
  EXPECT_EQ(pool.take(), 1u) << "given back first, handed out first";
  EXPECT_EQ(pool.take(), 0u);
  EXPECT_EQ(pool.take(), std::nullopt);
  // Each connection's partition, by the number it was advertised as.
  EXPECT_EQ(pool.partition_of(0), 0u);
  EXPECT_EQ(pool.partition_of(2), 2u);
  EXPECT_EQ(pool.partition_of(4), 1u);
  EXPECT_EQ(pool.partition_of(5), 0u);
  EXPECT_THROW(pool.partition_of(7), Error);
}

TEST(AggregateBook, APeersSlotsAreHeldFromItsDoorbellUntilItsAggregateIsTakenOrGivenUp) {
  using namespace std::chrono_literals;
  AggregateBook book(3, 2);
  const AggregateBook::Instant t0{};
  EXPECT_FALSE(book.holds_any(1));
  ASSERT_EQ(book.arrived(1, 11, 5, t0), Arrival::accepted);
  EXPECT_TRUE(book.holds_any(1));
  EXPECT_FALSE(book.holds_any(0));
  EXPECT_FALSE(book.holds_any(2));
  EXPECT_FALSE(book.holds_any(9)) << "no such peer";
  ASSERT_TRUE(book.granted(5, 40, 2, 0ns, t0 + 1s));
  EXPECT_TRUE(book.take_due(t0).empty()) << "one of two members came: not due yet";
  EXPECT_TRUE(book.holds_any(1));
  EXPECT_EQ(book.take_due(t0 + 2s).size(), 1u);  // given up with the member that came
  EXPECT_FALSE(book.holds_any(1));
  // A member whose aggregate is never granted holds its slot until it expires.
  ASSERT_EQ(book.arrived(2, 12, 6, t0), Arrival::accepted);
  EXPECT_EQ(book.expire_ungranted(t0 + 1s, 10s), 0u);
  EXPECT_TRUE(book.holds_any(2));
  EXPECT_EQ(book.expire_ungranted(t0 + 11s, 10s), 1u);
  EXPECT_FALSE(book.holds_any(2));
}

}  // namespace
}  // namespace gradlane::ps
