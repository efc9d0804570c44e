// Daemon: gradlaned's loop — the shared-memory segment, the app slots, and the one call site
// of the scheduling policy. No threads inside: run() is a loop over step(now), and tests drive
// step() themselves with whatever `now` they like.
//
// One step(now):
//   0. when due, the liveness sweep: dead apps are reclaimed with whatever they left queued;
//   1. attach/detach: if an app bumped attach_epoch, look at the claim words (accept an
//      attaching app, reclaim a detaching one, taking the completions it sent before leaving);
//   2. drain each app's request queue (at most batch_per_app entries), validating every entry
//      and answering a malformed one with an error grant to that app only;
//   3. schedule_and_route: the policy decides; each outcome goes to the app that asked
//      (routing.cpp) — the only place scheduling happens;
//   4. publish grants (overflow waits in the app's outbox, never dropped) and wake sleepers;
//   5. the heartbeat, when due.
//
// Idle: run() polls for idle_spin after the last work, then sleeps on the headers' doorbell
// futexes (every served segment's at once: futex_waitv; at most idle_sleep, or until the
// policy's next wake-up). Apps ring the doorbell only while the daemon sleeps, so a busy
// daemon costs them no system call.
//
// Segments: one shared by every job (config.shm_name), plus one per job given its own
// (--job-user), owned by that job's user, so the kernel keeps other jobs' processes out of
// it. The daemon serves them all in one loop with one scheduler: isolation is of memory,
// not of the schedule.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <map>
#include <unordered_map>
#include <vector>

#include "sidecar/core/outcome.hpp"
#include "sidecar/core/policy.hpp"
#include "sidecar/core/types.hpp"
#include "sidecar/daemon/app_session.hpp"
#include "sidecar/daemon/daemon_config.hpp"
#include "sidecar/daemon/job_door.hpp"
#include "sidecar/daemon/receivers.hpp"
#include "sidecar/daemon/schedule_record.hpp"
#include "sidecar/daemon/survivors.hpp"
#include "sidecar/shm/layout.hpp"
#include "sidecar/shm/segment.hpp"

namespace gradlane::sidecar {

struct DaemonStats {
  std::uint64_t attached = 0;           // attaches accepted
  std::uint64_t rejected = 0;           // attaches refused (incl. from an endpoint not served here)
  std::uint64_t detached = 0;           // clean detaches
  std::uint64_t reclaimed = 0;          // apps found dead and reclaimed
  std::uint64_t reclaimed_entries = 0;  // entries still queued by departed/dead apps, discarded
  std::uint64_t evicted = 0;            // apps whose queues were corrupted
  std::uint64_t submitted = 0;          // requests handed to the policy
  std::uint64_t completed = 0;          // completions handed to the policy
  std::uint64_t answers = 0;            // grant entries published (all kinds)
  std::uint64_t errors = 0;             // of which error grants
  std::uint64_t orphaned = 0;           // outcomes for apps that had left (transfers failed back)
  std::uint64_t unrouted = 0;           // aggregate grants with no local aggregator app, cancels
                                        // with no local server app
  std::uint64_t cancelled = 0;          // cancels delivered to a server app
  std::uint64_t acknowledged = 0;       // applied acks taken from server apps
  std::uint64_t takeovers = 0;          // promoted replicas whose receiver's sequence moved here
};

class Daemon {
 public:
  // Creates the segment (Error if another daemon serves the name) and starts serving it.
  Daemon(DaemonConfig config, std::unique_ptr<sched::Policy> policy);
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  // Marks the segment stopped (clients reattach to the next daemon), wakes sleeping clients,
  // and removes the name.
  ~Daemon();

  // One pass of the loop at time `now` (CLOCK_MONOTONIC). Returns how many entries moved in
  // either direction plus attach/detach events: 0 means there was nothing to do.
  std::size_t step(sched::Instant now);

  // Sleeps on the doorbell until an app rings it or `timeout` passes; returns at once if work
  // is already visible.
  void wait_for_work(std::chrono::nanoseconds timeout);

  // Loops step() until stop_requested() returns true; it is asked every heartbeat interval
  // while busy and after every sleep.
  void run(const std::function<bool()>& stop_requested);

  static sched::Instant clock_now() noexcept;

  const DaemonConfig& config() const noexcept { return config_; }
  const DaemonStats& stats() const noexcept { return stats_; }
  const ScheduleRecord& record() const noexcept { return record_; }
  std::uint64_t generation() const noexcept;
  std::size_t attached_apps() const noexcept { return active_.size(); }
  sched::Policy& policy() noexcept { return *policy_; }

 private:
  // attach.cpp — the lifecycle of app slots
  std::size_t scan_claims(std::uint32_t served, sched::Instant now);
  void accept(std::uint32_t slot, std::uint64_t claim, sched::Instant now);
  void reject(std::uint32_t slot, std::uint64_t claim, Reason reason);
  void evict(AppSession& app, Reason reason, sched::Instant now);
  void reclaim(std::uint32_t slot, sched::Instant now);
  void release_detached(std::uint32_t slot, sched::Instant now);
  bool serves(std::uint32_t endpoint) const;
  bool server_alive(std::uint32_t endpoint) const;  // the app serving it here, checked now
  bool has_own_segment(std::uint32_t job) const;
  // An app gone; `detached`: it said so (a server's job then no longer owns its endpoint).
  void forget(AppSession& app, sched::Instant now, bool detached);
  void take_last_completions(AppSession& app, sched::Instant now);
  void free_slot(std::uint32_t slot);
  void sweep(sched::Instant now);

  // routing.cpp — entries in, outcomes out
  std::size_t drain(AppSession& app, sched::Instant now);
  std::size_t take_entries(AppSession& app, sched::Instant now);  // drain(), once it may read the app
  void handle(AppSession& app, const shm::AppEntry& entry, sched::Instant now);
  void submit(AppSession& app, const shm::AppEntry& entry, sched::Instant now);
  void complete(AppSession& app, const shm::AppEntry& entry, sched::Instant now);
  void applied(AppSession& app, const shm::AppEntry& entry);
  std::size_t schedule_and_route(sched::Instant now);
  void route(const sched::Outcome& outcome, sched::Instant now);
  void answer(AppSession& app, const shm::GrantEntry& grant);
  void answer_error(AppSession& app, const shm::AppEntry& entry, Reason reason);
  void settle(AppSession& app, std::uint64_t app_request, sched::Instant now);
  std::size_t publish(sched::Instant now);

  bool work_visible(sched::Instant now);
  // The earliest time an app refused past its bounds may be read again, if one has entries waiting.
  std::optional<sched::Instant> next_over_bound_read();
  shm::AppSlot& slot_ref(std::uint32_t index) const noexcept;

  struct Route {
    std::uint32_t slot = 0;
    std::uint64_t app_request = 0;
  };

  // A segment the daemon serves: the shared one (job: none), or a job's own (--job-user).
  // Every one has the full layout (header, doorbell, max_apps slots); the daemon's slot index
  // i is slot i % max_apps of served_[i / max_apps].
  struct Served {
    shm::Segment segment;
    shm::Header* header = nullptr;
    std::optional<std::uint32_t> job;
    std::uint32_t seen_attach_epoch = 0;
  };
  // Holds the receivers of servers that outlived a dead daemon (survivors.hpp) until each takes
  // its sequence over through the segment it was found in.
  void hold_survivors(std::map<std::uint32_t, HeldEndpoint> held);
  // Writes `endpoint`'s owning job (none: released) into the owners book of the shared segment,
  // for a successor after a crash (shm/owner_book.hpp).
  void book_owner(std::uint32_t endpoint, std::optional<std::uint32_t> job);
  // Lays the header and the app slots out in a new segment and marks it running.
  Served publish(shm::Segment segment, std::optional<std::uint32_t> job, std::uint64_t generation, sched::Instant now);
  const Served& served_for(std::uint32_t slot) const noexcept { return served_[slot / config_.max_apps]; }
  std::uint32_t slot_count() const noexcept { return static_cast<std::uint32_t>(apps_.size()); }

  DaemonConfig config_;
  std::unique_ptr<sched::Policy> policy_;
  std::vector<Served> served_;  // [0]: the shared segment
  // Hands jobs' own segments to their users (none without --job-user).
  std::optional<JobDoor> door_;
  // Who speaks for each receiver endpoint: its server app, the job owning it, its grant key,
  // and the receivers held for a dead daemon's surviving servers.
  Receivers receivers_;
  AppSession* receiver_server(std::uint32_t endpoint, std::uint32_t job);
  // The token of a grant of `seq` at `receiver` (Receivers::token).
  std::uint64_t grant_token(std::uint32_t receiver, std::uint64_t seq, std::uint64_t carried) const;
  std::vector<std::optional<AppSession>> apps_;         // by slot index
  std::vector<std::uint32_t> active_;                   // slots with a session, in attach order
  std::unordered_map<sched::RequestId, Route> routes_;  // policy request id -> the app owed
  std::uint64_t next_request_ = 1;
  std::vector<sched::Outcome> outcomes_;  // reused buffer for schedule()
  std::vector<std::uint32_t> touched_;    // apps that got answers this pass
  std::size_t inputs_ = 0;                // submits/completions since the last schedule()
  sched::Instant next_heartbeat_{};
  sched::Instant next_sweep_{};
  DaemonStats stats_;
  ScheduleRecord record_;
};

}  // namespace gradlane::sidecar
