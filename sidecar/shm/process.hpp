// Knowing whether the process that owns an app slot (or the daemon) is still the one alive.
//
// A pid alone is not an identity: pids are reused, and a slot whose owner died could be
// "alive" again as an unrelated process. The identity is (pid, start time), the start time
// being field 22 of /proc/<pid>/stat (clock ticks since boot, fixed for a process's life).
// Watching an owner: open a pidfd (Linux >= 5.3) and *then* check the start time; if it
// matches, the pidfd refers to that very process and becomes readable when it exits — no
// polling of /proc afterwards. Without pidfd support, fall back to kill(pid, 0) plus the start
// time on every check.
//
// Limitation: pids are compared in the daemon's pid namespace, so applications in containers
// must share the host's pid namespace with their gradlaned (or run a gradlaned per container).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "common/unique_fd.hpp"

namespace gradlane::sidecar {

// Start time of `pid` (ticks since boot), or nullopt if there is no such process.
std::optional<std::uint64_t> process_start_time(pid_t pid);

// Whether (pid, start_time) names a live process (one /proc read).
bool process_alive(pid_t pid, std::uint64_t start_time);
// Whether `pid` has begun to exit (PF_EXITING), has exited, or is gone. A process's files,
// sockets and RDMA connections close while it exits, before a pidfd says it exited: its peers
// can see it gone first.
bool process_exiting(pid_t pid);

class ProcessWatch {
 public:
  // A watch on the process (pid, start_time), or nullopt if it is gone or is not that process.
  static std::optional<ProcessWatch> open(pid_t pid, std::uint64_t start_time);

  // One poll() of the pidfd (or a /proc read without pidfd support). Never throws.
  bool alive() const noexcept;
  // Not alive(), or begun to exit (process_exiting): gone, as its peers may have seen it.
  bool exiting() const noexcept;
  pid_t pid() const noexcept { return pid_; }
  int pidfd() const noexcept { return pidfd_.get(); }

 private:
  ProcessWatch(UniqueFd pidfd, pid_t pid, std::uint64_t start_time) noexcept
      : pidfd_(std::move(pidfd)), pid_(pid), start_time_(start_time) {}

  UniqueFd pidfd_;
  pid_t pid_ = 0;
  std::uint64_t start_time_ = 0;
};

}  // namespace gradlane::sidecar
