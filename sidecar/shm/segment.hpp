// The named shared-memory segment: created by gradlaned, mapped by applications.
//
// Who owns the name: the daemon holds an exclusive flock(2) on the segment for as long as it
// runs. The kernel drops the lock when the daemon dies, however it dies, so "is a daemon
// serving this segment?" has an answer that survives SIGKILL and pid reuse: try the lock.
// A new daemon that finds the name taken but the lock free knows the segment is stale and
// replaces it; one that finds the lock held refuses to start. (The heartbeat in the header
// covers the remaining case, a daemon that is alive but stuck.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/unique_fd.hpp"

namespace gradlane::sidecar::shm {

// A POSIX shm name is "/name" with no other '/' (it lives in /dev/shm). Throws
// Error(invalid_argument) naming `what` (e.g. "--shm-name") otherwise.
void check_shm_name(const std::string& name, const char* what);

// The label of job `job`'s own segment next to the shared one `shared` ("/gradlane-0" ->
// "/gradlane-0.job7"): a memfd's name (in /proc/<pid>/fd and messages), not a /dev/shm name;
// gradlaned creates it for a job given with --job-user.
std::string job_segment_name(const std::string& shared, std::uint32_t job);

// A new descriptor, with an open file description of its own, of the file open as `fd`
// (/proc/self/fd): flock(2) locks belong to open file descriptions, so one handed to an app
// cannot convert or drop the daemon's lock.
UniqueFd reopen(int fd);

class Segment {
 public:
  // Daemon side: creates `name` with mode 0600, exclusively locked, zero-filled, `bytes` long,
  // replacing a stale segment left by a dead daemon. Throws Error(invalid_argument) if a live
  // daemon holds it, Error(system) if the OS refuses. The created segment owns the name: it is
  // unlinked when the Segment is destroyed, including when the daemon fails half-way up.
  static Segment create(const std::string& name, std::size_t bytes);
  // Application side: maps an existing segment. nullopt if no such segment (no daemon ever
  // started, or it stopped cleanly) or it is not sized yet (a daemon is creating it right now).
  // Throws Error(sidecar_unavailable) if the segment exists but cannot be opened (permissions).
  static std::optional<Segment> open(const std::string& name);
  // Daemon side, a job's own segment (shm/door.hpp): a memfd labelled `label`, `bytes` long,
  // zero-filled, exclusively locked, sealed against shrinking and growing. It has no name:
  // apps get it through the daemon's door (reopen()).
  static Segment create_sealed(const std::string& label, std::size_t bytes);
  // Application side: maps the segment the door handed over. Throws Error(protocol) if it is
  // not sealed against resizing (not a segment gradlaned made).
  static Segment adopt(UniqueFd fd, const std::string& label);
  // Daemon side, looking for a dead daemon's job segment: opens `path` (/proc/<pid>/fd/<n>)
  // and maps it if it is sealed against resizing; nullopt if it is not. Throws if it cannot be
  // opened or mapped.
  static std::optional<Segment> open_sealed(const std::string& path, const std::string& label);
  // Daemon side: a descriptor of this segment to hand out (reopen(int)).
  UniqueFd reopen() const { return shm::reopen(fd_.get()); }

  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  void* base() const noexcept { return base_; }
  std::size_t bytes() const noexcept { return bytes_; }
  const std::string& name() const noexcept { return name_; }

  // The segment's owner (fstat): an application trusts only one of its own user's or root's,
  // since anyone may create a name in /dev/shm. nullopt if fstat fails.
  std::optional<std::uint32_t> owner_uid() const noexcept;
  // Whether some process (the daemon) holds the segment's exclusive lock. Application side.
  bool locked_by_daemon() const noexcept;
  // Daemon side: removes the name, if it still names this segment. Idempotent.
  void unlink() noexcept;
  bool owns_name() const noexcept { return owns_name_; }

 private:
  Segment(std::string name, UniqueFd fd, void* base, std::size_t bytes, bool owns_name) noexcept;
  void release() noexcept;

  std::string name_;
  UniqueFd fd_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  bool owns_name_ = false;
};

}  // namespace gradlane::sidecar::shm
