// The registration cache's logic, with a counting stand-in for ibv_reg_mr (the real
// registration path, including the stale-after-realloc case, runs over rxe in softroce/).
#include <gtest/gtest.h>

#include "gradlane/registration_cache.hpp"

namespace gradlane {
namespace {

struct FakeRegistration {
  std::uintptr_t addr;
  std::size_t length;
  Access access;
  int serial;
};

class RegistrationCacheTest : public ::testing::Test {
 protected:
  int registrations = 0;
  BasicRegistrationCache<FakeRegistration> cache{[this](void* addr, std::size_t length, Access access) {
    return FakeRegistration{reinterpret_cast<std::uintptr_t>(addr), length, access, ++registrations};
  }};
  alignas(64) std::byte memory[1 << 16]{};
};

TEST_F(RegistrationCacheTest, SecondLookupOfTheSameRangeIsAHit) {
  const auto& a = cache.get(memory, 4096, Access::remote_write);
  const auto& b = cache.get(memory, 4096, Access::remote_write);
  EXPECT_EQ(&a, &b);
  EXPECT_EQ(registrations, 1);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().misses, 1u);
}

TEST_F(RegistrationCacheTest, SameAddressDifferentLengthIsADifferentRegistration) {
  // ps-lite keys by address alone and would return the 4 KiB registration for the 64 KiB
  // buffer that replaced it at the same address.
  const auto& small = cache.get(memory, 4096, Access::remote_write);
  const auto& large = cache.get(memory, sizeof memory, Access::remote_write);
  EXPECT_NE(small.serial, large.serial);
  EXPECT_EQ(large.length, sizeof memory);
  EXPECT_EQ(registrations, 2);
}

TEST_F(RegistrationCacheTest, AccessRightsArePartOfTheKey) {
  const auto& w = cache.get(memory, 4096, Access::remote_write);
  const auto& r = cache.get(memory, 4096, Access::remote_read);
  EXPECT_NE(w.serial, r.serial);
  EXPECT_EQ(r.access, Access::remote_read);
}

TEST_F(RegistrationCacheTest, InvalidateDropsEveryOverlappingEntryAndOnlyThose) {
  cache.get(memory, 4096, Access::remote_write);         // [0, 4096)
  cache.get(memory + 4096, 4096, Access::remote_write);  // [4096, 8192)
  cache.get(memory + 8192, 4096, Access::remote_write);  // [8192, 12288)
  cache.get(memory, 12288, Access::remote_read);         // [0, 12288)
  // Free [4000, 4200): touches the first, second and the big one, not the third.
  EXPECT_EQ(cache.invalidate(memory + 4000, 200), 3u);
  EXPECT_EQ(cache.size(), 1u);
  const int before = registrations;
  cache.get(memory + 8192, 4096, Access::remote_write);
  EXPECT_EQ(registrations, before) << "the untouched entry must survive";
  cache.get(memory, 4096, Access::remote_write);
  EXPECT_EQ(registrations, before + 1) << "an invalidated entry must be registered anew";
  EXPECT_EQ(cache.stats().invalidated, 3u);
}

TEST_F(RegistrationCacheTest, AdjacentRangesDoNotOverlap) {
  cache.get(memory, 4096, Access::remote_write);
  EXPECT_EQ(cache.invalidate(memory + 4096, 4096), 0u);
  EXPECT_EQ(cache.invalidate(memory + 4095, 1), 1u);
}

TEST_F(RegistrationCacheTest, StaleAfterFreeAndReallocUnlessInvalidated) {
  // Same address and length after a free + malloc: the key cannot tell, so the caller must
  // invalidate; this documents that contract.
  const int first = cache.get(memory, 4096, Access::remote_write).serial;
  EXPECT_EQ(cache.get(memory, 4096, Access::remote_write).serial, first) << "no invalidate: stale hit";
  cache.invalidate(memory, 4096);
  EXPECT_NE(cache.get(memory, 4096, Access::remote_write).serial, first);
}

TEST_F(RegistrationCacheTest, EmptyRangeAndFullCacheAreErrors) {
  EXPECT_THROW(cache.get(nullptr, 16, Access::local), Error);
  EXPECT_THROW(cache.get(memory, 0, Access::local), Error);
  BasicRegistrationCache<FakeRegistration> tiny(
      [](void* a, std::size_t l, Access x) {
        return FakeRegistration{reinterpret_cast<std::uintptr_t>(a), l, x, 0};
      },
      2);
  tiny.get(memory, 1, Access::local);
  tiny.get(memory, 2, Access::local);
  try {
    tiny.get(memory, 3, Access::local);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::resource_exhausted);
    EXPECT_NE(std::string(e.what()).find("invalidate()"), std::string::npos);
  }
}

TEST_F(RegistrationCacheTest, RegistrarFailureLeavesNoEntry) {
  BasicRegistrationCache<FakeRegistration> failing(
      [](void*, std::size_t, Access) -> FakeRegistration { throw Error(Errc::memlock_too_low, "pinning failed"); });
  EXPECT_THROW(failing.get(memory, 4096, Access::local), Error);
  EXPECT_EQ(failing.size(), 0u);
}

}  // namespace
}  // namespace gradlane
