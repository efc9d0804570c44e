#include "sidecar/daemon/survivors.hpp"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <optional>

#include "sidecar/shm/layout.hpp"
#include "sidecar/shm/owner_book.hpp"
#include "sidecar/shm/process.hpp"
#include "sidecar/shm/segment.hpp"

namespace gradlane::sidecar {

namespace {

// Whether `segment` is one a dead daemon of `owner_uid` left: no daemon holds its lock, and it
// belongs to that user (anyone can make a segment under the same name or label).
bool left_by_dead_daemon(const shm::Segment& segment, std::uint32_t owner_uid) {
  return !segment.locked_by_daemon() && segment.owner_uid() == owner_uid;
}

// Whether `segment` is a dead daemon's (left_by_dead_daemon) of this layout, whole: anything
// else is not read (and will be replaced).
bool of_this_layout(const shm::Segment& segment, std::uint32_t owner_uid) {
  if (!left_by_dead_daemon(segment, owner_uid) || segment.bytes() < shm::header_bytes()) return false;
  const shm::Header& h = *shm::header_at(segment.base());
  return h.magic.load(std::memory_order_acquire) == shm::kMagic && h.layout_version == shm::kLayoutVersion &&
         h.ring_capacity == shm::kRingCapacity && h.max_apps <= shm::kMaxApps &&
         segment.bytes() >= shm::segment_bytes(h.max_apps);
}

// The live server apps in a dead daemon's segment (of_this_layout).
std::vector<Survivor> servers_in(const shm::Segment& segment, std::uint32_t owner_uid) {
  std::vector<Survivor> found;
  if (!of_this_layout(segment, owner_uid)) return found;
  const shm::Header& h = *shm::header_at(segment.base());
  for (std::uint32_t i = 0; i < h.max_apps; ++i) {
    const shm::AppSlot& s = *shm::slot_at(segment.base(), i);
    const std::uint64_t word = s.claim.load(std::memory_order_acquire);
    if (shm::claim_state(word) != shm::SlotState::active || s.slots == 0) continue;
    const Survivor survivor{s.endpoint, shm::claim_pid(word), s.owner_start_time, s.job};
    if (!process_alive(static_cast<pid_t>(survivor.pid), survivor.start_time)) continue;
    const bool known =
        std::any_of(found.begin(), found.end(), [&](const Survivor& f) { return f.endpoint == survivor.endpoint; });
    if (!known) found.push_back(survivor);  // one server per endpoint: the first one stands
  }
  return found;
}

}  // namespace

std::map<std::uint32_t, HeldEndpoint> endpoints_to_hold(const std::vector<SurvivorsIn>& segments,
                                                        const std::map<std::uint32_t, std::uint32_t>& owners,
                                                        const std::function<bool(std::uint32_t)>& serves) {
  std::map<std::uint32_t, HeldEndpoint> held;
  const auto has_own_segment = [&](std::uint32_t job) {
    return std::any_of(segments.begin(), segments.end(), [&](const SurvivorsIn& s) { return s.job == job; });
  };
  for (std::uint32_t segment = 0; segment < segments.size(); ++segment) {
    const SurvivorsIn& in = segments[segment];
    for (const Survivor& survivor : in.survivors) {
      const bool vouched = in.job ? survivor.job == *in.job : !has_own_segment(survivor.job);
      const auto owner = owners.find(survivor.endpoint);
      const bool owns = owner != owners.end() && owner->second == survivor.job;
      // One segment vouches for the owner's records, and servers_in() keeps one per endpoint.
      if (vouched && owns && serves(survivor.endpoint))
        held.try_emplace(survivor.endpoint, HeldEndpoint{survivor, segment});
    }
  }
  return held;
}

std::map<std::uint32_t, std::uint32_t> endpoint_owners(const std::string& name, std::uint32_t owner_uid) {
  try {
    if (const auto segment = shm::Segment::open(name); segment && of_this_layout(*segment, owner_uid)) {
      return shm::OwnerBook::read(*shm::header_at(segment->base()));
    }
  } catch (const std::exception&) {
    // Unreadable (another user's, vanished meanwhile): no owners, nothing held.
  }
  return {};
}

std::vector<Survivor> surviving_servers(const std::string& name, std::uint32_t owner_uid) {
  try {
    if (const auto segment = shm::Segment::open(name)) return servers_in(*segment, owner_uid);
  } catch (const std::exception&) {
    // Unreadable (another user's, vanished meanwhile): nothing to hold.
  }
  return {};
}

std::vector<Survivor> surviving_servers_in_job_segment(const std::string& label, std::uint32_t owner_uid) {
  // How /proc shows a memfd: "/memfd:<label> (deleted)".
  const std::string link = "/memfd:" + label + " (deleted)";
  std::error_code ec;
  for (const auto& process : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = process.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fd_ec;  // a process that exits, or one we may not look into: skipped
    for (const auto& fd : std::filesystem::directory_iterator(process.path() / "fd", fd_ec)) {
      std::error_code read_ec;
      if (std::filesystem::read_symlink(fd.path(), read_ec).string() != link || read_ec) continue;
      try {
        const std::optional<shm::Segment> segment = shm::Segment::open_sealed(fd.path().string(), label);
        // A memfd an app made under the same label is not ours: look on for the daemon's.
        if (!segment || !left_by_dead_daemon(*segment, owner_uid)) continue;
        // Every app of the job maps the same one: the first copy found tells it all.
        return servers_in(*segment, owner_uid);
      } catch (const std::exception&) {
        // Gone meanwhile, or not ours to open: look on.
      }
    }
  }
  return {};
}

}  // namespace gradlane::sidecar
