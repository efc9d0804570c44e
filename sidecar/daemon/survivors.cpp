#include "sidecar/daemon/survivors.hpp"

#include <algorithm>
#include <exception>

#include "sidecar/shm/layout.hpp"
#include "sidecar/shm/process.hpp"
#include "sidecar/shm/segment.hpp"

namespace gradlane::sidecar {

std::vector<std::uint32_t> surviving_servers(const std::string& name) {
  std::vector<std::uint32_t> endpoints;
  try {
    const auto segment = shm::Segment::open(name);
    if (!segment || segment->locked_by_daemon() || segment->bytes() < shm::header_bytes()) return endpoints;
    const shm::Header& h = *shm::header_at(segment->base());
    // Only a segment of this layout, whole: anything else is not read (and will be replaced).
    if (h.magic.load(std::memory_order_acquire) != shm::kMagic || h.layout_version != shm::kLayoutVersion ||
        h.ring_capacity != shm::kRingCapacity || h.max_apps > shm::kMaxApps ||
        segment->bytes() < shm::segment_bytes(h.max_apps)) {
      return endpoints;
    }
    for (std::uint32_t i = 0; i < h.max_apps; ++i) {
      const shm::AppSlot& s = *shm::slot_at(segment->base(), i);
      const std::uint64_t word = s.claim.load(std::memory_order_acquire);
      if (shm::claim_state(word) != shm::SlotState::active || s.slots == 0) continue;
      if (!process_alive(static_cast<pid_t>(shm::claim_pid(word)), s.owner_start_time)) continue;
      if (std::find(endpoints.begin(), endpoints.end(), s.endpoint) == endpoints.end()) endpoints.push_back(s.endpoint);
    }
  } catch (const std::exception&) {
    // Unreadable (another user's, vanished meanwhile): nothing to hold.
  }
  return endpoints;
}

}  // namespace gradlane::sidecar
