// The lifecycle of app slots: accept an attach, reclaim a detach, evict a misbehaving app,
// and sweep for apps (or half-finished claims) whose process died.
//
// Claim word transitions (layout.hpp), and who makes them:
//   free -> claiming            app, CAS (the claim: state and pid in one word)
//   claiming -> attaching       app, CAS, after writing its identity and attach arguments
//   attaching -> active         daemon, CAS (the app may give up concurrently: attaching -> free)
//   attaching -> rejected       daemon, CAS; the app reads `reason` and frees the slot
//   active -> detaching         app, CAS; the daemon reclaims
//   active -> evicted           daemon; the app sees it on its next call and detaches
//   any held state -> free      daemon, when the owner is gone (sweep) or has detached
// Only the daemon frees a slot that was active, and it resets the rings first, so a new owner
// always starts with empty queues.
#include <signal.h>

#include <algorithm>
#include <cerrno>

#include "sidecar/daemon/daemon.hpp"
#include "sidecar/shm/futex.hpp"
#include "sidecar/shm/process.hpp"

namespace gradlane::sidecar {
namespace {

using shm::SlotState;

// Entries an app left in its request ring (read from shared memory, so only a statistic).
std::uint64_t queued_entries(const shm::AppSlot& s) {
  const std::uint64_t tail = s.requests.tail.load(std::memory_order_acquire);
  const std::uint64_t head = s.requests.head.load(std::memory_order_acquire);
  return tail >= head ? std::min<std::uint64_t>(tail - head, shm::kRingCapacity) : 0;
}

// For slots the daemon has no session for: is the pid in the claim word still a process?
// The start time guards against pid reuse once the app has written it (after `claiming`).
bool holder_alive(const shm::AppSlot& s, std::uint64_t word) {
  const auto pid = static_cast<pid_t>(shm::claim_pid(word));
  if (shm::claim_state(word) == SlotState::claiming) {
    return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
  }
  return process_alive(pid, s.owner_start_time);
}

}  // namespace

std::size_t Daemon::scan_claims(std::uint32_t served, sched::Instant now) {
  std::size_t events = 0;
  const std::uint32_t first = served * config_.max_apps;
  for (std::uint32_t i = first; i < first + config_.max_apps; ++i) {
    shm::AppSlot& s = slot_ref(i);
    const std::uint64_t word = s.claim.load(std::memory_order_acquire);
    switch (shm::claim_state(word)) {
      case SlotState::attaching:
        if (!apps_[i]) {
          accept(i, word, now);
          ++events;
        }
        break;
      case SlotState::detaching:
        if (apps_[i]) {
          release_detached(i, now);
        } else {
          stats_.reclaimed_entries += queued_entries(s);
          free_slot(i);
        }
        ++events;
        break;
      default:
        break;
    }
  }
  return events;
}

void Daemon::accept(std::uint32_t slot, std::uint64_t claim, sched::Instant now) {
  shm::AppSlot& s = slot_ref(slot);
  const auto pid = static_cast<pid_t>(shm::claim_pid(claim));
  auto owner = ProcessWatch::open(pid, s.owner_start_time);
  if (!owner) {
    // Gone already: nobody to answer. Alive but another start time: not who claimed it.
    if (::kill(pid, 0) != 0 && errno == ESRCH) {
      free_slot(slot);
    } else {
      reject(slot, claim, Reason::owner_mismatch);
    }
    return;
  }
  if (s.region_bytes == 0) {
    reject(slot, claim, Reason::bad_attach);
    return;
  }
  // A job with a segment of its own is served only there, and a job's segment only that job.
  const std::uint32_t job = s.job;  // read once: the app could change it
  const auto& own = served_for(slot).job;
  if (own ? job != *own : has_own_segment(job)) {
    reject(slot, claim, Reason::own_segment);
    return;
  }
  const std::uint64_t take_over = s.take_over;  // read once each: the app could change them
  const std::uint32_t endpoint = s.endpoint;
  const std::uint32_t slots = s.slots;
  const bool as_server = take_over != 0 || slots != 0;  // it speaks for its receiver's sequence
  sched::GrantKey key{};
  std::copy(std::begin(s.grant_key), std::end(s.grant_key), key.begin());
  const bool keyed = key != sched::GrantKey{};
  if (keyed && !as_server) {  // only a server checks tokens (the client refuses this itself)
    reject(slot, claim, Reason::bad_attach);
    return;
  }
  if (as_server && receivers_.owned_by_another(endpoint, job)) {
    reject(slot, claim, Reason::receiver_of_another_job);  // before it narrows that job's window
    return;
  }
  if (take_over != 0) {
    // A promoted replica: its receiver's sequence is ours from now on, if we stand by for it.
    // Or the very server that outlived the daemon before us (same process, job and segment),
    // taking its own sequence on from where it says (its receiver is held until then).
    const auto& standby = config_.standby;
    const bool standing_by = std::any_of(standby.begin(), standby.end(), [&](const DaemonConfig::Standby& named) {
      return named.endpoint == endpoint && named.job == job;
    });
    const Survivor attaching{endpoint, shm::claim_pid(claim), s.owner_start_time, job};
    const bool survivor = receivers_.take_survivor(endpoint, attaching, slot / config_.max_apps);
    if ((!survivor && !standing_by) ||
        !policy_->take_over(sched::EndpointId{endpoint}, take_over - 1, sched::JobId{job}, now)) {
      reject(slot, claim, Reason::bad_takeover);
      return;
    }
    ++inputs_;  // the old owner's pending parts are dropped by the next schedule()
    ++stats_.takeovers;
  } else if (!serves(endpoint)) {
    reject(slot, claim, Reason::unknown_endpoint);
    return;
  }
  // A server's slots bound how far its sequence may run ahead of what it applied.
  if (slots != 0) policy_->limit_window(sched::EndpointId{endpoint}, slots);
  AppSession app;
  app.slot = slot;
  app.pid = static_cast<std::uint32_t>(pid);
  app.owner = std::move(owner);
  app.limits = AppLimits{
      .job = job, .endpoint = endpoint, .region_bytes = s.region_bytes, .max_update_bytes = config_.max_update_bytes};
  app.requests = shm::RingReader<shm::AppEntry, shm::kRingCapacity>(&s.requests);
  app.grants = shm::RingWriter<shm::GrantEntry, shm::kRingCapacity>(&s.grants);

  std::uint64_t expected = claim;
  if (!s.claim.compare_exchange_strong(expected, shm::claim_word(SlotState::active, app.pid),
                                       std::memory_order_acq_rel)) {
    return;  // the app gave up waiting (it freed the slot itself) or died and was swept
  }
  apps_[slot].emplace(std::move(app));
  active_.push_back(slot);
  // The latest of its job to attach as the server speaks for it (a server restarted in place
  // may attach before its dead predecessor is swept).
  if (as_server) {
    receivers_.seat(endpoint, job, slot, keyed ? std::optional(key) : std::nullopt);
    book_owner(endpoint, job);
    policy_->serve_job(sched::EndpointId{endpoint}, sched::JobId{job}, keyed ? std::optional(key) : std::nullopt);
  }
  ++stats_.attached;
  shm::ring_bell(s.app_sleeping, s.grant_bell);  // the app sleeps until it sees `active`
}

void Daemon::reject(std::uint32_t slot, std::uint64_t claim, Reason reason) {
  shm::AppSlot& s = slot_ref(slot);
  s.reason.store(static_cast<std::uint32_t>(reason), std::memory_order_relaxed);
  std::uint64_t expected = claim;
  if (s.claim.compare_exchange_strong(expected, shm::claim_word(SlotState::rejected, shm::claim_pid(claim)),
                                      std::memory_order_acq_rel)) {
    ++stats_.rejected;
    shm::ring_bell(s.app_sleeping, s.grant_bell);
  }
}

void Daemon::evict(AppSession& app, Reason reason, sched::Instant now) {
  shm::AppSlot& s = slot_ref(app.slot);
  const std::uint32_t pid = app.pid;
  forget(app, now, /*detached=*/false);
  // The slot stays held (evicted) until its owner detaches or dies: it may still be writing.
  s.reason.store(static_cast<std::uint32_t>(reason), std::memory_order_relaxed);
  s.claim.store(shm::claim_word(SlotState::evicted, pid), std::memory_order_release);
  ++stats_.evicted;
  shm::ring_bell(s.app_sleeping, s.grant_bell);
}

void Daemon::release_detached(std::uint32_t slot, sched::Instant now) {
  take_last_completions(*apps_[slot], now);
  forget(*apps_[slot], now, /*detached=*/true);
  free_slot(slot);
  ++stats_.detached;
}

bool Daemon::server_alive(std::uint32_t endpoint) const {
  const auto server = receivers_.server_slot(endpoint);
  // Exiting counts as gone: its connections close before its pidfd says it exited, so the
  // replica that saw them close may ask to take over first.
  return server && apps_[*server] && !apps_[*server]->owner->exiting();
}

bool Daemon::serves(std::uint32_t endpoint) const {
  return config_.endpoints.empty() ||
         std::find(config_.endpoints.begin(), config_.endpoints.end(), endpoint) != config_.endpoints.end();
}

AppSession* Daemon::receiver_server(std::uint32_t endpoint, std::uint32_t job) {
  const auto server = receivers_.server_slot(endpoint, job);
  return server ? &*apps_[*server] : nullptr;
}

bool Daemon::has_own_segment(std::uint32_t job) const {
  return std::any_of(served_.begin(), served_.end(), [job](const Served& s) { return s.job == job; });
}

void Daemon::reclaim(std::uint32_t slot, sched::Instant now) {
  stats_.reclaimed_entries += queued_entries(slot_ref(slot));
  forget(*apps_[slot], now, /*detached=*/false);
  free_slot(slot);
  ++stats_.reclaimed;
}

void Daemon::take_last_completions(AppSession& app, sched::Instant now) {
  // A detaching app is alive and finished: completions it queued before leaving still return
  // credit and measure bandwidth, and a server app's last `applied` still opens the replica
  // window (it is an `applied`, not a completion: taken for one, it would be lost).
  // Its unanswered requests are moot (nobody will read a grant).
  shm::AppEntry entry;
  for (std::uint32_t n = 0; n < shm::kRingCapacity && app.requests.pop(entry) == shm::RingStatus::ok; ++n) {
    if (check_envelope(entry) || entry.op == shm::Op::submit) {
      ++stats_.reclaimed_entries;
    } else if (entry.op == shm::Op::applied) {
      applied(app, entry);
    } else {
      complete(app, entry, now);
    }
  }
  app.outbox.clear();  // answers to a departed app (incl. errors from complete() above)
}

void Daemon::forget(AppSession& app, sched::Instant now, bool detached) {
  // Granted transfers that will never be completed give their credit back as failed. (Parts the
  // policy has not decided yet come back later as orphaned outcomes: see route().)
  for (auto& [app_request, owed] : app.owed) {
    routes_.erase(owed.id);
    owed.granted.for_each([&](sched::TransferId transfer) {
      policy_->complete(transfer, now, sched::Nanos{0}, sched::TransferResult::failed);
      ++inputs_;
    });
  }
  for (const auto& [aggregate, transfer] : app.aggregates) {
    policy_->complete(transfer, now, sched::Nanos{0}, sched::TransferResult::failed);
    ++inputs_;
  }
  const std::uint32_t slot = app.slot;
  // Detached, its job no longer owns the receiver; otherwise it keeps it, and the scheduler its
  // requests.
  if (receivers_.unseat(app.limits.endpoint, slot, detached) && detached) {
    policy_->serve_job(sched::EndpointId{app.limits.endpoint}, std::nullopt);
    book_owner(app.limits.endpoint, std::nullopt);
  }
  active_.erase(std::find(active_.begin(), active_.end(), slot));
  apps_[slot].reset();  // `app` dangles from here on
}

void Daemon::free_slot(std::uint32_t slot) {
  shm::AppSlot& s = slot_ref(slot);
  s.requests.reset();
  s.grants.reset();
  s.reason.store(0, std::memory_order_relaxed);
  s.app_sleeping.store(0, std::memory_order_relaxed);
  s.claim.store(shm::claim_word(SlotState::free, 0), std::memory_order_release);
}

void Daemon::sweep(sched::Instant now) {
  for (std::size_t k = 0; k < active_.size();) {
    const std::uint32_t slot = active_[k];
    if (apps_[slot]->owner->alive()) {
      ++k;
    } else if (shm::claim_state(slot_ref(slot).claim.load(std::memory_order_acquire)) == SlotState::detaching) {
      // It detached and then exited before the attach scan saw the detach (the sweep runs
      // first in step()): a clean departure, with its last completions, not a death.
      release_detached(slot, now);  // removes active_[k]
    } else {
      reclaim(slot, now);  // removes active_[k]
    }
  }
  // Slots held without a session: a claim abandoned half-way, or a rejected / evicted /
  // detaching app that died before it let go.
  for (std::uint32_t i = 0; i < slot_count(); ++i) {
    if (apps_[i]) continue;
    shm::AppSlot& s = slot_ref(i);
    const std::uint64_t word = s.claim.load(std::memory_order_acquire);
    const SlotState state = shm::claim_state(word);
    if (state == SlotState::free || state == SlotState::attaching) continue;  // attaching: scan_claims
    if (holder_alive(s, word)) continue;
    stats_.reclaimed_entries += queued_entries(s);
    free_slot(i);
    ++stats_.reclaimed;
  }
}

}  // namespace gradlane::sidecar
