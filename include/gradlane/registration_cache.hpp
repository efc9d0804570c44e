// gradlane — registration cache.
//
// Registering memory pins pages and programs the NIC's translation table: far too slow to do
// per update, so registrations are cached. The key is (address, length, access), not the
// address alone: ps-lite keys by address only, so after a buffer is freed and a different-size
// one is allocated at the same address it hands out a registration that covers the wrong
// pages. Even an exact (address, length) key cannot see a free + re-allocation of the same
// size — the old MR still pins the *old* physical pages — so whoever frees a cached buffer
// must call invalidate() first. The cache never evicts on its own: an in-flight RDMA operation
// may still be using any registration it handed out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"

namespace gradlane {

struct RegistrationCacheStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t invalidated = 0;
};

// Generic over the registration type so the caching logic is testable without a NIC.
// `Registration` must be movable; the registrar creates one for (addr, length, access).
template <class Registration>
class BasicRegistrationCache {
 public:
  using Registrar = std::function<Registration(void* addr, std::size_t length, Access access)>;

  explicit BasicRegistrationCache(Registrar registrar, std::size_t capacity = 4096)
      : registrar_(std::move(registrar)), capacity_(capacity) {}

  // The registration of exactly [addr, addr+length) with `access`, registering on a miss.
  // The reference stays valid until that entry is invalidated or the cache is destroyed.
  const Registration& get(void* addr, std::size_t length, Access access) {
    if (addr == nullptr || length == 0) {
      throw Error(Errc::invalid_argument, "registration cache: cannot register an empty range");
    }
    const Key key{reinterpret_cast<std::uintptr_t>(addr), length, static_cast<unsigned>(access)};
    if (auto it = entries_.find(key); it != entries_.end()) {
      ++stats_.hits;
      return it->second;
    }
    if (entries_.size() >= capacity_) {
      throw Error(Errc::resource_exhausted,
                  "registration cache is full (" + std::to_string(capacity_) +
                      " registrations): invalidate() buffers before freeing them, or raise the "
                      "capacity if the job really uses that many distinct buffers");
    }
    ++stats_.misses;
    return entries_.emplace(key, registrar_(addr, length, access)).first->second;
  }

  // Drops every registration overlapping [addr, addr+length). Call before freeing or
  // reallocating memory that may be cached. Returns how many were dropped.
  std::size_t invalidate(const void* addr, std::size_t length) {
    const auto begin = reinterpret_cast<std::uintptr_t>(addr);
    const auto end = begin + length;
    std::size_t dropped = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      const auto [start, len, access] = it->first;
      (void)access;
      if (start < end && begin < start + len) {
        it = entries_.erase(it);
        ++dropped;
      } else {
        ++it;
      }
    }
    stats_.invalidated += dropped;
    return dropped;
  }

  void clear() {
    stats_.invalidated += entries_.size();
    entries_.clear();
  }
  std::size_t size() const { return entries_.size(); }
  const RegistrationCacheStats& stats() const { return stats_; }

 private:
  using Key = std::tuple<std::uintptr_t, std::size_t, unsigned>;
  Registrar registrar_;
  std::size_t capacity_;
  std::map<Key, Registration> entries_;
  RegistrationCacheStats stats_;
};

// The cache of real memory regions of one device.
class RegistrationCache : public BasicRegistrationCache<MemoryRegion> {
 public:
  explicit RegistrationCache(const Device& device, std::size_t capacity = 4096);
};

}  // namespace gradlane
