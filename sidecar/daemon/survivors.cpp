#include "sidecar/daemon/survivors.hpp"

#include <algorithm>
#include <exception>

#include "sidecar/shm/layout.hpp"
#include "sidecar/shm/process.hpp"
#include "sidecar/shm/segment.hpp"

namespace gradlane::sidecar {

std::vector<Survivor> surviving_servers(const std::string& name, std::uint32_t owner_uid) {
  std::vector<Survivor> found;
  try {
    const auto segment = shm::Segment::open(name);
    if (!segment || segment->locked_by_daemon() || segment->bytes() < shm::header_bytes() ||
        segment->owner_uid() != owner_uid) {
      return found;
    }
    const shm::Header& h = *shm::header_at(segment->base());
    // Only a segment of this layout, whole: anything else is not read (and will be replaced).
    if (h.magic.load(std::memory_order_acquire) != shm::kMagic || h.layout_version != shm::kLayoutVersion ||
        h.ring_capacity != shm::kRingCapacity || h.max_apps > shm::kMaxApps ||
        segment->bytes() < shm::segment_bytes(h.max_apps)) {
      return found;
    }
    for (std::uint32_t i = 0; i < h.max_apps; ++i) {
      const shm::AppSlot& s = *shm::slot_at(segment->base(), i);
      const std::uint64_t word = s.claim.load(std::memory_order_acquire);
      if (shm::claim_state(word) != shm::SlotState::active || s.slots == 0) continue;
      const Survivor survivor{s.endpoint, shm::claim_pid(word), s.owner_start_time, s.job};
      if (!process_alive(static_cast<pid_t>(survivor.pid), survivor.start_time)) continue;
      const bool known = std::any_of(found.begin(), found.end(),
                                     [&](const Survivor& f) { return f.endpoint == survivor.endpoint; });
      if (!known) found.push_back(survivor);  // one server per endpoint: the first one stands
    }
  } catch (const std::exception&) {
    // Unreadable (another user's, vanished meanwhile): nothing to hold.
  }
  return found;
}

}  // namespace gradlane::sidecar
