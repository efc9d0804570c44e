// The shared-memory ring on its own: order, full/empty, wrap-around, and that a corrupted
// index is reported instead of followed.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "sidecar/shm/ring.hpp"

namespace gradlane::sidecar::shm {
namespace {

struct Item {
  std::uint64_t value;
};
using SmallRing = Ring<Item, 8>;

TEST(SidecarRing, KeepsOrderAcrossWrapAround) {
  auto ring = std::make_unique<SmallRing>();
  RingWriter<Item, 8> writer(ring.get());
  RingReader<Item, 8> reader(ring.get());
  std::uint64_t next_in = 0;
  std::uint64_t next_out = 0;
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 5; ++i) ASSERT_EQ(writer.push(Item{next_in++}), RingStatus::ok);
    Item item{};
    for (int i = 0; i < 5; ++i) {
      ASSERT_EQ(reader.pop(item), RingStatus::ok);
      EXPECT_EQ(item.value, next_out++);
    }
    EXPECT_EQ(reader.pop(item), RingStatus::empty);
  }
}

TEST(SidecarRing, FullIsReportedAndNothingIsOverwritten) {
  auto ring = std::make_unique<SmallRing>();
  RingWriter<Item, 8> writer(ring.get());
  RingReader<Item, 8> reader(ring.get());
  for (std::uint64_t i = 0; i < 8; ++i) ASSERT_EQ(writer.push(Item{i}), RingStatus::ok);
  EXPECT_EQ(writer.push(Item{99}), RingStatus::full);
  EXPECT_EQ(writer.backlog(), 8U);
  Item item{};
  ASSERT_EQ(reader.pop(item), RingStatus::ok);
  EXPECT_EQ(item.value, 0U);
  EXPECT_EQ(writer.push(Item{8}), RingStatus::ok);
  for (std::uint64_t i = 1; i <= 8; ++i) {
    ASSERT_EQ(reader.pop(item), RingStatus::ok);
    EXPECT_EQ(item.value, i);
  }
}

TEST(SidecarRing, ReaderRejectsAWriteIndexThatRanAhead) {
  auto ring = std::make_unique<SmallRing>();
  RingReader<Item, 8> reader(ring.get());
  ring->tail.store(1'000'000);  // a scribbling producer
  Item item{};
  EXPECT_EQ(reader.pop(item), RingStatus::corrupt);
  EXPECT_FALSE(reader.ready());
}

TEST(SidecarRing, WriterRejectsAReadIndexFromTheFuture) {
  auto ring = std::make_unique<SmallRing>();
  RingWriter<Item, 8> writer(ring.get());
  for (std::uint64_t i = 0; i < 8; ++i) ASSERT_EQ(writer.push(Item{i}), RingStatus::ok);
  ring->head.store(77);  // a scribbling consumer claims to have read entries never written
  EXPECT_EQ(writer.push(Item{8}), RingStatus::corrupt);
}

TEST(SidecarRing, TwoThreadsMoveEveryEntryOnceInOrder) {
  auto ring = std::make_unique<Ring<Item, 64>>();
  constexpr std::uint64_t kCount = 200'000;
  std::thread producer([&] {
    RingWriter<Item, 64> writer(ring.get());
    for (std::uint64_t i = 0; i < kCount;) {
      if (writer.push(Item{i}) == RingStatus::ok) ++i;
    }
  });
  RingReader<Item, 64> reader(ring.get());
  std::uint64_t expected = 0;
  Item item{};
  while (expected < kCount) {
    const RingStatus s = reader.pop(item);
    ASSERT_NE(s, RingStatus::corrupt);
    if (s == RingStatus::ok) {
      ASSERT_EQ(item.value, expected++);
    }
  }
  producer.join();
}

}  // namespace
}  // namespace gradlane::sidecar::shm
