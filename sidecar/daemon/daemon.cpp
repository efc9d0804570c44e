#include "sidecar/daemon/daemon.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <array>
#include <span>
#include <new>
#include <random>
#include <string>

#include "gradlane/error.hpp"
#include "sidecar/daemon/survivors.hpp"
#include "sidecar/shm/door.hpp"
#include "sidecar/shm/futex.hpp"
#include "sidecar/shm/owner_book.hpp"
#include "sidecar/shm/process.hpp"

namespace gradlane::sidecar {
namespace {

std::unique_ptr<sched::Policy> require(std::unique_ptr<sched::Policy> policy) {
  if (!policy) throw Error(Errc::invalid_argument, "gradlaned needs a scheduling policy");
  return policy;
}

std::uint64_t random_generation() {
  std::random_device device;  // getrandom(2): distinct across restarts, unlike a counter
  const std::uint64_t g = (std::uint64_t{device()} << 32) | device();
  return g == 0 ? 1 : g;  // 0 reads as "never attached" in the client
}

}  // namespace

void DaemonConfig::validate() const {
  const auto bad = [](const std::string& what) { throw Error(Errc::invalid_argument, what); };
  shm::check_shm_name(shm_name, "--shm-name");
  if (max_apps == 0 || max_apps > shm::kMaxApps) {
    bad("--max-apps " + std::to_string(max_apps) + " is out of range: use 1.." + std::to_string(shm::kMaxApps));
  }
  if (job_segments.size() + 1 > shm::kMaxWaitWords) {
    bad("--job-user given " + std::to_string(job_segments.size()) + " times: at most " +
        std::to_string(shm::kMaxWaitWords - 1) + " jobs can have a segment of their own");
  }
  if (!job_segments.empty()) (void)shm::door_address(shm_name);  // the door's address must fit
  for (std::size_t i = 0; i < job_segments.size(); ++i) {
    shm::check_shm_name(shm::job_segment_name(shm_name, job_segments[i].job), "--job-user's segment");
    for (std::size_t k = 0; k < i; ++k) {
      if (job_segments[k].job == job_segments[i].job) {
        bad("--job-user names job " + std::to_string(job_segments[i].job) + " twice: one user per job");
      }
    }
  }
  if (max_update_bytes == 0) bad("--max-update-bytes must be positive");
  if (max_outstanding == 0) bad("--max-outstanding must be positive");
  if (max_owed_bytes < max_update_bytes) bad("--max-owed-bytes must be at least --max-update-bytes");
  if (batch_per_app == 0) bad("batch_per_app must be positive");
  if (heartbeat_every <= std::chrono::nanoseconds::zero() || liveness_every <= std::chrono::nanoseconds::zero() ||
      idle_sleep <= std::chrono::nanoseconds::zero() || idle_spin < std::chrono::nanoseconds::zero() ||
      over_bound_every < std::chrono::nanoseconds::zero()) {
    bad("daemon intervals must be positive (idle spin and over_bound_every may be 0)");
  }
}

Daemon::Daemon(DaemonConfig config, std::unique_ptr<sched::Policy> policy)
    : config_((config.validate(), std::move(config))), policy_(require(std::move(policy))) {
  const sched::Instant now = clock_now();
  const std::uint64_t generation = random_generation();  // one for all: a reattach tells a new daemon
  const auto own_uid = static_cast<std::uint32_t>(::geteuid());
  for (const auto& j : config_.job_segments) {
    // An app trusts a door of root's or its own user's making only (shm/door.hpp).
    if (own_uid != 0 && j.uid != own_uid) {
      throw Error(Errc::invalid_argument,
                  fmt::format("--job-user {}:{} needs gradlaned to run as root (it runs as uid {}): job {}'s apps "
                              "take a segment only from a daemon of root or of their own user",
                              j.job, j.uid, own_uid, j.job));
    }
  }
  // served_[0] is the shared segment, served_[1 + k] job_segments[k]'s: a sealed memfd each,
  // handed out by the door (shm/door.hpp). The shared segment's name is taken first (a second
  // gradlaned on it stops there, before opening a door) and published last: an app that finds
  // it running and no door may conclude its job has none (Reason::own_segment would correct it).
  const std::size_t bytes = shm::segment_bytes(config_.max_apps);
  // Before create() replaces a dead daemon's segment: its servers that outlived it. The
  // segment is the one gradlaned made for our user, or it is ignored.
  std::vector<SurvivorsIn> survivors{{std::nullopt, surviving_servers(config_.shm_name, own_uid)}};
  const std::map<std::uint32_t, std::uint32_t> owners = endpoint_owners(config_.shm_name, own_uid);
  policy_->check_servers_with([this](sched::EndpointId receiver) { return server_alive(sched::to_int(receiver)); });
  shm::Segment shared = shm::Segment::create(config_.shm_name, bytes);
  std::vector<Served> jobs;
  std::map<std::uint32_t, JobDoor::Job> door_jobs;
  for (const auto& j : config_.job_segments) {
    const std::string label = shm::job_segment_name(config_.shm_name, j.job);
    // Before its successor exists: the servers that outlived a dead daemon's segment of the job.
    survivors.push_back({j.job, surviving_servers_in_job_segment(label, own_uid)});
    jobs.push_back(publish(shm::Segment::create_sealed(label, bytes), j.job, generation, now));
    door_jobs[j.job] = JobDoor::Job{j.uid, jobs.back().segment.reopen()};
  }
  if (!door_jobs.empty()) door_.emplace(config_.shm_name, std::move(door_jobs));
  served_.push_back(publish(std::move(shared), std::nullopt, generation, now));
  for (Served& j : jobs) served_.push_back(std::move(j));
  // In served_'s order: the shared segment, then each job's.
  hold_survivors(endpoints_to_hold(survivors, owners, [this](std::uint32_t endpoint) {
    return serves(endpoint) || std::any_of(config_.standby.begin(), config_.standby.end(),
                                           [&](const DaemonConfig::Standby& s) { return s.endpoint == endpoint; });
  }));
  apps_.resize(std::size_t{config_.max_apps} * served_.size());
  next_heartbeat_ = now + config_.heartbeat_every;
  next_sweep_ = now + config_.liveness_every;
  outcomes_.reserve(256);
  routes_.reserve(1024);
}

void Daemon::hold_survivors(std::map<std::uint32_t, HeldEndpoint> held) {
  for (const auto& [endpoint, survivor] : held) {
    policy_->hold_receiver(sched::EndpointId{endpoint});
    book_owner(endpoint, survivor.server.job);  // still its job's, should we die before its takeover
  }
  receivers_.hold(std::move(held));
}

void Daemon::book_owner(std::uint32_t endpoint, std::optional<std::uint32_t> job) {
  shm::OwnerBook book(*served_.front().header);
  if (!job) {
    book.release(endpoint);
  } else if (!book.record(endpoint, *job)) {
    std::fprintf(stderr,
                 "gradlaned: endpoint %u's owner (job %u) is not in the owners book, which holds %u endpoints: "
                 "a daemon restarted after a crash will not hold it for its server (its replica takes over)\n",
                 endpoint, *job, shm::kOwnerBookEntries);
  }
}

Daemon::Served Daemon::publish(shm::Segment segment, std::optional<std::uint32_t> job, std::uint64_t generation,
                               sched::Instant now) {
  Served served{std::move(segment), nullptr, job, 0};
  void* base = served.segment.base();
  // The mapping is zero-filled by ftruncate; placement-new starts the objects' lifetimes.
  shm::Header* h = new (base) shm::Header{};
  for (std::uint32_t i = 0; i < config_.max_apps; ++i) {
    new (shm::slot_at(base, i)) shm::AppSlot{};
  }
  h->layout_version = shm::kLayoutVersion;
  h->max_apps = config_.max_apps;
  h->ring_capacity = shm::kRingCapacity;
  h->daemon_pid = static_cast<std::uint32_t>(::getpid());
  h->daemon_start_time = process_start_time(::getpid()).value_or(0);
  h->generation = generation;
  h->segment_bytes = served.segment.bytes();
  h->max_update_bytes = config_.max_update_bytes;
  h->state.store(static_cast<std::uint32_t>(shm::DaemonState::running), std::memory_order_relaxed);
  h->heartbeat_ns.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  // Last, with release: an opener that sees the magic sees everything above.
  h->magic.store(shm::kMagic, std::memory_order_release);
  served.header = h;
  return served;
}

Daemon::~Daemon() {
  for (const Served& served : served_) {
    served.header->state.store(static_cast<std::uint32_t>(shm::DaemonState::stopped), std::memory_order_release);
  }
  // Clients asleep in wait() wake up, see `stopped`, and go looking for the next daemon.
  for (std::uint32_t i = 0; i < slot_count(); ++i) {
    shm::AppSlot& s = slot_ref(i);
    s.grant_bell.fetch_add(1, std::memory_order_release);
    shm::futex_wake(s.grant_bell);
  }
  // The segments' destructors then unlink the shared name and close the jobs' memfds: the next
  // daemon creates new segments.
}

sched::Instant Daemon::clock_now() noexcept {
  // steady_clock is CLOCK_MONOTONIC on Linux: the clock the layout promises to applications.
  return sched::Instant(std::chrono::duration_cast<sched::Nanos>(std::chrono::steady_clock::now().time_since_epoch()));
}

std::uint64_t Daemon::generation() const noexcept { return served_.front().header->generation; }

shm::AppSlot& Daemon::slot_ref(std::uint32_t index) const noexcept {
  return *shm::slot_at(served_for(index).segment.base(), index % config_.max_apps);
}

std::size_t Daemon::step(sched::Instant now) {
  std::size_t work = 0;
  // The sweep goes first: entries an app queued before it died are reclaimed, never scheduled.
  if (now >= next_sweep_) {
    sweep(now);
    next_sweep_ = now + config_.liveness_every;
  }
  for (std::size_t k = 0; k < served_.size(); ++k) {
    const std::uint32_t epoch = served_[k].header->attach_epoch.load(std::memory_order_acquire);
    if (epoch != served_[k].seen_attach_epoch) {
      served_[k].seen_attach_epoch = epoch;
      work += scan_claims(static_cast<std::uint32_t>(k), now);
    }
  }
  // By index: evict() may remove the current slot from active_.
  for (std::size_t i = 0; i < active_.size(); ++i) {
    const std::uint32_t slot = active_[i];
    work += drain(*apps_[slot], now);
    if (!apps_[slot]) --i;  // evicted while draining
  }
  const auto wake = policy_->next_wakeup();
  if (inputs_ > 0 || (wake && *wake <= now)) work += schedule_and_route(now);
  work += publish(now);

  if (now >= next_heartbeat_) {
    for (const Served& served : served_) {
      served.header->heartbeat_ns.store(now.time_since_epoch().count(), std::memory_order_release);
    }
    next_heartbeat_ = now + config_.heartbeat_every;
  }
  return work;
}

bool Daemon::work_visible(sched::Instant now) {
  for (const Served& served : served_) {
    if (served.header->attach_epoch.load(std::memory_order_acquire) != served.seen_attach_epoch) return true;
  }
  for (const std::uint32_t slot : active_) {
    AppSession& app = *apps_[slot];
    if (app.requests.ready() && !app.deferred(now)) return true;
  }
  return false;
}

std::optional<sched::Instant> Daemon::next_over_bound_read() {
  std::optional<sched::Instant> earliest;
  for (const std::uint32_t slot : active_) {
    AppSession& app = *apps_[slot];
    if (app.over_bound && app.requests.ready() && (!earliest || app.read_again_at < *earliest)) {
      earliest = app.read_again_at;
    }
  }
  return earliest;
}

void Daemon::wait_for_work(std::chrono::nanoseconds timeout) {
  std::array<shm::WatchedWord, shm::kMaxWaitWords> bells{};
  for (std::size_t k = 0; k < served_.size(); ++k) {
    shm::Header& h = *served_[k].header;
    bells[k] = {&h.doorbell, h.doorbell.load(std::memory_order_acquire)};
    h.daemon_sleeping.store(1, std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with the fence in ring_bell()
  if (!work_visible(clock_now())) shm::futex_wait_any(std::span(bells.data(), served_.size()), timeout);
  for (const Served& served : served_) served.header->daemon_sleeping.store(0, std::memory_order_relaxed);
}

void Daemon::run(const std::function<bool()>& stop_requested) {
  sched::Instant last_work = clock_now();
  sched::Instant next_stop_check = last_work;
  for (;;) {
    const sched::Instant now = clock_now();
    if (step(now) > 0) last_work = now;
    if (now >= next_stop_check) {
      if (stop_requested()) return;
      next_stop_check = now + config_.heartbeat_every;
    }
    if (now - last_work < config_.idle_spin) {
      shm::back_off(now - last_work);
      continue;
    }
    auto sleep = config_.idle_sleep;
    if (const auto wake = policy_->next_wakeup()) sleep = std::min<std::chrono::nanoseconds>(sleep, *wake - now);
    if (const auto read = next_over_bound_read()) sleep = std::min<std::chrono::nanoseconds>(sleep, *read - now);
    // Grants waiting in an outbox move only when the app pops; it does not ring us for that.
    const bool backlog =
        std::any_of(active_.begin(), active_.end(), [this](std::uint32_t s) { return !apps_[s]->outbox.empty(); });
    if (backlog) sleep = std::min<std::chrono::nanoseconds>(sleep, std::chrono::microseconds(500));
    if (sleep > std::chrono::nanoseconds::zero()) wait_for_work(sleep);
    if (stop_requested()) return;
  }
}

}  // namespace gradlane::sidecar
