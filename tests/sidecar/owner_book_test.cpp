// The owners book gradlaned keeps for its successor (sidecar/shm/owner_book.hpp).
#include "sidecar/shm/owner_book.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>

namespace gradlane::sidecar::shm {
namespace {

using Owners = std::map<std::uint32_t, std::uint32_t>;

TEST(OwnerBook, RecordsEachEndpointsJobOnceAndForgetsAReleasedOne) {
  auto header = std::make_unique<Header>();
  OwnerBook book(*header);
  EXPECT_TRUE(OwnerBook::read(*header).empty());
  EXPECT_TRUE(book.record(9, 1));
  EXPECT_TRUE(book.record(0, 4));  // endpoint 0 is an endpoint too
  EXPECT_TRUE(book.record(UINT32_MAX, 2));
  EXPECT_EQ(OwnerBook::read(*header), (Owners{{0, 4}, {9, 1}, {UINT32_MAX, 2}}));
  EXPECT_TRUE(book.record(9, 3)) << "a promoted replica of another job";
  EXPECT_EQ(OwnerBook::read(*header), (Owners{{0, 4}, {9, 3}, {UINT32_MAX, 2}})) << "replaced, not added";
  book.release(0);
  book.release(5);  // never booked: nothing happens
  EXPECT_EQ(OwnerBook::read(*header), (Owners{{9, 3}, {UINT32_MAX, 2}}));
}

TEST(OwnerBook, AFullBookSaysSoAndAReleasedEntryIsReused) {
  auto header = std::make_unique<Header>();
  OwnerBook book(*header);
  for (std::uint32_t endpoint = 0; endpoint < kOwnerBookEntries; ++endpoint) ASSERT_TRUE(book.record(endpoint, 1));
  EXPECT_FALSE(book.record(kOwnerBookEntries, 1)) << "full";
  EXPECT_TRUE(book.record(7, 2)) << "an endpoint it names is rebooked in place";
  book.release(3);
  EXPECT_TRUE(book.record(kOwnerBookEntries, 1));
  const Owners owners = OwnerBook::read(*header);
  EXPECT_EQ(owners.size(), kOwnerBookEntries);
  EXPECT_EQ(owners.at(7), 2u);
  EXPECT_FALSE(owners.contains(3));
}

TEST(OwnerBook, AnEndpointNamedTwiceIsNobodys) {
  // No daemon writes that: a process of the daemon's user did. The book does not say whose it is.
  auto header = std::make_unique<Header>();
  OwnerBook(*header).record(9, 1);
  header->owners[5].job = 2;
  header->owners[5].endpoint_plus_one.store(10);
  OwnerBook(*header).record(4, 1);
  EXPECT_EQ(OwnerBook::read(*header), (Owners{{4, 1}}));
}

}  // namespace
}  // namespace gradlane::sidecar::shm
