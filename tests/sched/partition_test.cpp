#include "sidecar/core/partition.hpp"

#include <gtest/gtest.h>

#include "sched_test_util.hpp"

namespace gradlane::sched {
namespace {

using testing::kMiB;

TEST(Partitioner, SmallTensorsAreOnePart) {
  const Partitioner p;  // 4 MiB, 64-byte aligned
  EXPECT_EQ(p.count(1), 1u);
  EXPECT_EQ(p.count(4 * kMiB), 1u);
  EXPECT_EQ(p.part(1000, 0), (Partition{0, 1, 0, 1000}));
}

TEST(Partitioner, LargeTensorsSplitIntoNearEqualAlignedParts) {
  const Partitioner p;
  // 10 MiB -> 3 parts of ~3.33 MiB, not 4 + 4 + 2.
  const auto parts = p.split(10 * kMiB);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], (Partition{0, 3, 0, 3495296}));
  EXPECT_EQ(parts[1], (Partition{1, 3, 3495296, 3495296}));
  EXPECT_EQ(parts[2], (Partition{2, 3, 6990592, 10 * kMiB - 6990592}));
  for (const Partition& part : parts) {
    EXPECT_EQ(part.offset % 64, 0u);
    EXPECT_LE(part.length, 4 * kMiB);
  }
}

TEST(Partitioner, NoTensorIsCutIntoMorePartsThanTheBound) {
  const Partitioner p(64, 64);
  EXPECT_EQ(p.count(64 * Bytes{Partitioner::kMaxParts}), Partitioner::kMaxParts);
  // Past it the parts grow: 2^40 bytes at a 64-byte target would be 2^34 parts.
  for (const Bytes bytes : {64 * Bytes{Partitioner::kMaxParts} + 1, Bytes{1} << 40}) {
    const std::uint32_t n = p.count(bytes);
    EXPECT_LE(n, Partitioner::kMaxParts) << bytes;
    const Partition last = p.part(bytes, n - 1);
    EXPECT_EQ(last.offset + last.length, bytes) << "the parts still cover " << bytes << " bytes";
    EXPECT_EQ(p.part(bytes, 0).length % 64, 0u);
  }
}

TEST(Partitioner, PartsCoverTheTensorExactlyForManySizes) {
  const Partitioner p(1000, 8);
  for (Bytes bytes = 1; bytes < 20'000; bytes += 37) {
    const auto parts = p.split(bytes);
    ASSERT_EQ(parts.size(), p.count(bytes));
    Bytes next = 0;
    for (const Partition& part : parts) {
      EXPECT_EQ(part.offset, next);
      EXPECT_GT(part.length, 0u);
      EXPECT_LE(part.length, 1000u + 7u);  // target, rounded up to the alignment at most
      next += part.length;
    }
    EXPECT_EQ(next, bytes);
  }
}

TEST(Partitioner, SameTensorSameCutEverywhere) {
  const Partitioner a(4 * kMiB, 64);
  const Partitioner b(4 * kMiB, 64);
  EXPECT_EQ(a.split(123'456'789), b.split(123'456'789));
}

}  // namespace
}  // namespace gradlane::sched
