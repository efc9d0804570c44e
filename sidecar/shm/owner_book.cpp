// OwnerBook (owner_book.hpp).
#include "sidecar/shm/owner_book.hpp"

#include <set>

namespace gradlane::sidecar::shm {

OwnedEndpoint* OwnerBook::find(std::uint32_t endpoint) noexcept {
  for (OwnedEndpoint& entry : header_->owners) {
    if (entry.endpoint_plus_one.load(std::memory_order_relaxed) == std::uint64_t{endpoint} + 1) return &entry;
  }
  return nullptr;
}

bool OwnerBook::record(std::uint32_t endpoint, std::uint32_t job) noexcept {
  OwnedEndpoint* entry = find(endpoint);
  if (entry != nullptr && entry->job == job) return true;
  if (entry == nullptr) {
    for (OwnedEndpoint& free : header_->owners) {
      if (free.endpoint_plus_one.load(std::memory_order_relaxed) == 0) {
        entry = &free;
        break;
      }
    }
    if (entry == nullptr) return false;
  }
  entry->endpoint_plus_one.store(0, std::memory_order_release);
  entry->job = job;
  entry->endpoint_plus_one.store(std::uint64_t{endpoint} + 1, std::memory_order_release);
  return true;
}

void OwnerBook::release(std::uint32_t endpoint) noexcept {
  if (OwnedEndpoint* entry = find(endpoint)) entry->endpoint_plus_one.store(0, std::memory_order_release);
}

std::map<std::uint32_t, std::uint32_t> OwnerBook::read(const Header& header) {
  std::map<std::uint32_t, std::uint32_t> owners;
  std::set<std::uint32_t> twice;
  for (const OwnedEndpoint& entry : header.owners) {
    const std::uint64_t named = entry.endpoint_plus_one.load(std::memory_order_acquire);
    if (named == 0 || named > std::uint64_t{UINT32_MAX} + 1) continue;
    const auto endpoint = static_cast<std::uint32_t>(named - 1);
    if (!owners.try_emplace(endpoint, entry.job).second) twice.insert(endpoint);
  }
  for (const std::uint32_t endpoint : twice) owners.erase(endpoint);
  return owners;
}

}  // namespace gradlane::sidecar::shm
