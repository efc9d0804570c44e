#include <infiniband/verbs.h>

#include <gtest/gtest.h>

#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"

namespace gradlane {
namespace {

TEST(Memlock, UnlimitedOrCapabilityOrEnoughIsFine) {
  EXPECT_EQ(memlock_problem(std::nullopt, false, 1ull << 40), std::nullopt);
  EXPECT_EQ(memlock_problem(64 * 1024, true, 1ull << 30), std::nullopt);
  EXPECT_EQ(memlock_problem(8u << 20, false, 8u << 20), std::nullopt);
}

TEST(Memlock, TooLowSaysHowMuchAndHowToRaiseIt) {
  const auto problem = memlock_problem(8u << 20, false, 64u << 20);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("8 MiB"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("64 MiB"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("ulimit -l unlimited"), std::string::npos);
  EXPECT_NE(problem->find("limits.conf"), std::string::npos);
  EXPECT_NE(problem->find("LimitMEMLOCK"), std::string::npos);
  EXPECT_NE(problem->find("memlock=-1"), std::string::npos);
}

TEST(Memlock, OddSizesArePrintedInBytes) {
  const auto problem = memlock_problem(1000, false, 1001);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("1000 bytes"), std::string::npos) << *problem;
}

TEST(Access, MinimalVerbsFlags) {
  EXPECT_EQ(to_ibv_access(Access::local), 0);
  EXPECT_EQ(to_ibv_access(Access::local_write), IBV_ACCESS_LOCAL_WRITE);
  // Verbs requires LOCAL_WRITE with REMOTE_WRITE.
  EXPECT_EQ(to_ibv_access(Access::remote_write), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  EXPECT_EQ(to_ibv_access(Access::remote_read), IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(to_ibv_access(Access::remote_read | Access::remote_write),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  // A region peers reach only through memory windows: bind right, no remote right of its own.
  EXPECT_EQ(to_ibv_access(Access::local_write | Access::windows), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
}

TEST(RegionDescriptor, WireFormatRoundTripsAndIsLittleEndian) {
  const RegionDescriptor d{0x0102030405060708ull, 0x1122334455667788ull, 0xa1b2c3d4u};
  std::array<std::byte, RegionDescriptor::kWireSize> wire{};
  d.encode(wire);
  EXPECT_EQ(wire[0], std::byte{0x08});
  EXPECT_EQ(wire[8], std::byte{0x88});
  EXPECT_EQ(wire[16], std::byte{0xd4});
  EXPECT_EQ(RegionDescriptor::decode(wire), d);
}

TEST(RegionDescriptor, ContainsIsOverflowSafe) {
  const RegionDescriptor d{0x1000, 4096, 1};
  EXPECT_TRUE(d.contains(0, 4096));
  EXPECT_TRUE(d.contains(4096, 0));
  EXPECT_FALSE(d.contains(1, 4096));
  EXPECT_FALSE(d.contains(4097, 0));
  EXPECT_FALSE(d.contains(~std::uint64_t{0} - 5, 10)) << "offset + length wraps";
  EXPECT_FALSE(d.contains(10, ~std::uint64_t{0}));
}

TEST(Buffer, PageAlignedZeroedAndMovable) {
  Buffer b = Buffer::allocate(10000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 4096, 0u);
  EXPECT_EQ(b.size(), 10000u);
  EXPECT_EQ(b.mapped_size(), 12288u);
  EXPECT_FALSE(b.on_hugepages());
  EXPECT_EQ(b.data()[9999], std::byte{0});
  std::byte* p = b.data();
  Buffer moved = std::move(b);
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
}

TEST(Buffer, LargeBuffersFallBackWhenNoHugepagesAreFree) {
  // Whether hugepages exist depends on the machine; with Pages::any the allocation succeeds
  // either way and says which it got.
  Buffer b = Buffer::allocate(4u << 20);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 4096, 0u);
  if (b.on_hugepages()) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % (2u << 20), 0u);
  }
  b.data()[(4u << 20) - 1] = std::byte{1};
}

TEST(Buffer, ZeroBytesIsAnError) { EXPECT_THROW(Buffer::allocate(0), Error); }

}  // namespace
}  // namespace gradlane
