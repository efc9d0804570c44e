// gradlaned's knobs, declared once with their defaults and why. Flags in main.cpp set them;
// GRADLANE_SIDECAR_SHM sets the default segment name for the daemon and its clients alike.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "gradlane/sidecar.hpp"

namespace gradlane::sidecar {

struct DaemonConfig {
  // --shm-name: the segment applications attach to (default: GRADLANE_SIDECAR_SHM or
  // /gradlane-<uid>, see default_shm_name()).
  std::string shm_name = default_shm_name();
  // --endpoint: the NICs (scheduler endpoint ids) of this host. An app attaching from any
  // other endpoint is refused (Reason::unknown_endpoint): its requests would be scheduled on a
  // NIC this sidecar does not own. Empty (no --endpoint flag): every endpoint is accepted,
  // the permissive single-daemon mode the in-process tests and benchmarks use.
  std::vector<std::uint32_t> endpoints;
  // --standby ENDPOINT:JOB: a receiver (server endpoint) whose replica, an app of JOB, runs on
  // this host. If that replica is promoted, it attaches with AttachOptions::take_over_at and
  // this sidecar takes over the receiver's sequence (the policy's take_over). Any other
  // takeover is refused (Reason::bad_takeover): an app of another job, or a stray one, must not
  // be able to move a server's sequence. (Only --job-user makes the job an app says it is
  // more than its word: see there.)
  struct Standby {
    std::uint32_t endpoint = 0;
    std::uint32_t job = 0;
  };
  std::vector<Standby> standby;
  // --job-user JOB:USER: job JOB gets a segment of its own, which only USER's processes (and
  // root's) can get: a sealed memfd (no name in /dev/shm; nobody can resize it under the
  // daemon) handed out by the daemon's door, which asks the kernel who is knocking
  // (SO_PEERCRED, shm/door.hpp). So a process of another job can neither attach as JOB nor read
  // JOB's queues nor write a grant into them, and there is no secret to leak. JOB's apps attach
  // there (the client asks the door first), and an attach as JOB on the shared segment is
  // refused (Reason::own_segment). Jobs not named here share shm_name: the daemon's user's.
  struct JobSegment {
    std::uint32_t job = 0;
    std::uint32_t uid = 0;
  };
  std::vector<JobSegment> job_segments;
  // --max-apps: app slots in the segment (33 KiB each). 64 covers 8 GPUs x 8 worker processes.
  std::uint32_t max_apps = 64;
  // --max-update-bytes: a larger request is refused as absurd (Reason::bad_size). 16 GiB is
  // above any single gradient tensor in practice and far below a corrupted 64-bit size.
  std::uint64_t max_update_bytes = std::uint64_t{16} << 30;
  // --max-outstanding: requests one app may have unanswered or granted-but-not-completed.
  // Bounds the daemon's memory per app; beyond it requests get Reason::too_many_outstanding.
  std::uint32_t max_outstanding = 4096;
  // --max-owed-bytes: bytes one app may have requested and not yet had decided and completed.
  // Each request becomes bytes / 4 MiB parts queued in the scheduler, pushed in the loop that
  // serves every job: without this an app could queue 4,096 x 16 GiB (~16.7 M parts) and stall
  // the others. 256 GiB: a few updates of the largest models in flight at once. Beyond it
  // requests get Reason::too_many_outstanding.
  std::uint64_t max_owed_bytes = std::uint64_t{256} << 30;
  // Entries taken from one app per loop pass, so a flooding app cannot starve the others (one
  // per pass from an app refused past its bounds, until it settles something it owes).
  std::uint32_t batch_per_app = 64;
  // An app refused past its bounds has its next entry read no sooner than this after the last,
  // until it settles something it owes: one that keeps its queue full past its bound would
  // otherwise keep the loop busy for good, a core taken from the other jobs' apps. Asking past
  // the bound is a bug or abuse, and the wait falls on that app (its completions queued behind
  // refused requests wait too). 0: one entry per pass.
  std::chrono::nanoseconds over_bound_every = std::chrono::milliseconds(1);
  // How often the heartbeat in the header is refreshed. Clients call a daemon dead after
  // kClientStaleHeartbeat (sidecar client) without one, which must be much larger.
  std::chrono::nanoseconds heartbeat_every = std::chrono::milliseconds(10);
  // How often attached apps are checked for death (one poll() over their pidfds). A dead
  // app's slot and queued entries come back within this bound.
  std::chrono::nanoseconds liveness_every = std::chrono::milliseconds(100);
  // --idle-spin-us: after the last work, the loop keeps polling (then yielding, see back_off in
  // futex.hpp) this long before sleeping on the futex. Polling answers a request in about a
  // cache-line round trip; a futex wake-up costs 5-70 us (more from a halted vCPU). Measured in
  // perf/sidecar (BM_SidecarRoundTrip daemon_spin_us -1 / 200 / 0); 0 sleeps at once.
  std::chrono::nanoseconds idle_spin = std::chrono::microseconds(200);
  // Longest sleep: the loop wakes at least this often to heartbeat, sweep and look at signals,
  // so a SIGTERM takes effect within it. 20 ms is ~50 wake-ups/s: no measurable CPU.
  std::chrono::nanoseconds idle_sleep = std::chrono::milliseconds(20);

  // Throws Error(invalid_argument) naming the flag of the first unusable value.
  void validate() const;
};

// --job-user JOB:USER, USER a name (its primary group too) or a numeric uid (group = uid);
// Error(invalid_argument) naming the flag for anything else.
DaemonConfig::JobSegment parse_job_user(const std::string& text);
// --standby ENDPOINT:JOB, two numbers; Error(invalid_argument) naming the flag otherwise.
DaemonConfig::Standby parse_standby(const std::string& text);

}  // namespace gradlane::sidecar
