// The application's half of the attach protocol (the daemon's half is sidecar/daemon/attach.cpp).
//
//   1. open the segment by name; it must carry our magic and layout version, be `running`,
//      be locked by a live daemon, and have a fresh heartbeat — otherwise keep retrying until
//      attach_timeout (a daemon may be starting or restarting), then fail with what was seen;
//   2. claim a free slot with one CAS (state|pid), write our identity (pid start time) and
//      attach arguments, flip it to `attaching`, bump attach_epoch and ring the doorbell;
//   3. sleep on the slot's grant bell until the daemon makes it `active` (or `rejected`).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "common/monotonic.hpp"
#include "sidecar/client/client_state.hpp"
#include "sidecar/shm/door.hpp"
#include "sidecar/shm/futex.hpp"
#include "sidecar/shm/process.hpp"

namespace gradlane::sidecar {
namespace {

using Clock = std::chrono::steady_clock;
using shm::SlotState;

std::string start_hint(const std::string& name) {
  return fmt::format(
      "start it with `gradlaned --shm-name {}` (or point GRADLANE_SIDECAR_SHM at the "
      "name a running gradlaned serves)",
      name);
}

// Why this segment cannot be attached right now (retry), or nullopt if it can. Throws for
// what retrying cannot fix (not a gradlaned segment, another layout version).
std::optional<std::string> unusable(const shm::Segment& segment) {
  if (segment.bytes() < shm::header_bytes()) return "its segment is still being created";
  const shm::Header& h = *shm::header_at(segment.base());
  const std::uint64_t magic = h.magic.load(std::memory_order_acquire);
  if (magic == 0) return "its segment is still being created";
  if (magic != shm::kMagic) {
    throw Error(Errc::protocol, fmt::format("{} is not a gradlaned segment (magic {:#x}): pick the "
                                            "name gradlaned serves (--shm-name / GRADLANE_SIDECAR_SHM)",
                                            segment.name(), magic));
  }
  if (h.layout_version != shm::kLayoutVersion || h.ring_capacity != shm::kRingCapacity ||
      segment.bytes() < shm::segment_bytes(h.max_apps)) {
    throw Error(Errc::protocol,
                fmt::format("gradlaned (pid {}) serving {} speaks segment layout v{} (queues of {}), this "
                            "library v{} (queues of {}): run a gradlaned from the same gradlane release",
                            h.daemon_pid, segment.name(), h.layout_version, h.ring_capacity, shm::kLayoutVersion,
                            shm::kRingCapacity));
  }
  if (h.state.load(std::memory_order_acquire) != static_cast<std::uint32_t>(shm::DaemonState::running)) {
    return fmt::format("the gradlaned (pid {}) that served {} has stopped", h.daemon_pid, segment.name());
  }
  if (!segment.locked_by_daemon()) {
    return fmt::format("the gradlaned (pid {}) that created {} is gone (it died without cleaning up)", h.daemon_pid,
                       segment.name());
  }
  const auto age = std::chrono::nanoseconds(monotonic_ns() - h.heartbeat_ns.load(std::memory_order_acquire));
  if (age > kStaleHeartbeat) {
    return fmt::format("gradlaned (pid {}) serving {} has not shown a heartbeat for {} ms (stopped or stuck?)",
                       h.daemon_pid, segment.name(),
                       std::chrono::duration_cast<std::chrono::milliseconds>(age).count());
  }
  return std::nullopt;
}

// Sleeps on the slot's grant bell (eventcount, see futex.hpp) until the claim word changes
// from `word` or `timeout` passes.
void await_claim_change(shm::AppSlot& slot, std::uint64_t word, std::chrono::nanoseconds timeout) {
  const std::uint32_t seen = slot.grant_bell.load(std::memory_order_acquire);
  slot.app_sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (slot.claim.load(std::memory_order_acquire) == word) shm::futex_wait(slot.grant_bell, seen, timeout);
  slot.app_sleeping.store(0, std::memory_order_relaxed);
}

enum class Claimed { attached, no_answer };

// What to change, for the refusals the application itself can fix.
std::string attach_refusal_hint(Reason reason, const shm::Header& h, const AttachOptions& o) {
  switch (reason) {
    case Reason::bad_attach:
      return " (AttachOptions::region_bytes must be > 0)";
    case Reason::bad_takeover:
      return fmt::format(
          " (AttachOptions::take_over_at: gradlaned (pid {}) was not started with --standby {}:{}, "
          "so it does not take over that endpoint's sequence for job {})",
          h.daemon_pid, o.endpoint, o.job, o.job);
    case Reason::unknown_endpoint:
      return fmt::format(
          " (AttachOptions::endpoint {} is not a NIC of this host: gradlaned (pid {}) serves only "
          "the endpoints given to it with --endpoint)",
          o.endpoint, h.daemon_pid);
    case Reason::own_segment:
      return fmt::format(
          " (job {} has a segment of its own, given to its user with gradlaned --job-user: its apps "
          "attach there, as that user, getting it from the daemon's door)",
          o.job);
    case Reason::receiver_of_another_job:
      return fmt::format(
          " (endpoint {}'s server is an app of another job, attached to gradlaned (pid {}) with "
          "AttachOptions::slots or take_over_at: a receiver's sequence serves one job; give this "
          "job's server an endpoint of its own)",
          o.endpoint, h.daemon_pid);
    default:
      return "";
  }
}

// A segment only gradlaned (run as root, or as this app's user) can have made: /dev/shm takes
// names from anyone, and a segment of another user's making could answer with forged grants.
std::optional<shm::Segment> trusted(std::optional<shm::Segment> segment) {
  if (!segment) return segment;
  const auto owner = segment->owner_uid();
  if (!owner || !shm::trusted_maker(*owner)) {
    throw Error(Errc::sidecar_unavailable,
                fmt::format("{} belongs to uid {}, neither this process's (uid {}) nor root's: gradlaned did not "
                            "make it for this app (another user's daemon, or a name squatted in /dev/shm); "
                            "pick the segment gradlaned serves (GRADLANE_SIDECAR_SHM)",
                            segment->name(), owner ? std::to_string(*owner) : "?", ::geteuid()));
  }
  return segment;
}

// How long one knock at the door may take: it answers from a thread of its own, without
// waiting for other knocks; the attach loop knocks again until its deadline.
constexpr std::chrono::milliseconds kDoorAnswerWithin{1000};

// The segment this app attaches through: its job's own if gradlaned has one for it (--job-user:
// from the daemon's door), else the shared one. nullopt, saying why in `problem`: neither
// exists (yet), or the door did not answer this time.
std::optional<shm::Segment> open_segment(const AttachOptions& o, std::string& problem) {
  shm::DoorAnswer door = shm::ask_door(o.shm_name, o.job, kDoorAnswerWithin);
  switch (door.kind) {
    case shm::DoorAnswer::Kind::no_answer:
      problem = fmt::format("gradlaned's door for job {}'s segment: {}", o.job, door.problem);
      return std::nullopt;
    case shm::DoorAnswer::Kind::granted:
      return shm::Segment::adopt(std::move(door.segment), shm::job_segment_name(o.shm_name, o.job));
    case shm::DoorAnswer::Kind::not_your_job:
      throw Error(Errc::sidecar_unavailable,
                  fmt::format("job {} has a segment of its own on gradlaned serving {}, and this process (uid {}) "
                              "may not map it: gradlaned gives it to job {}'s user only (uid {}, --job-user {}:USER); "
                              "run the app as that user, or attach as the job this user runs",
                              o.job, o.shm_name, ::geteuid(), o.job, door.job_uid, o.job),
                  EACCES);
    case shm::DoorAnswer::Kind::no_door:
    case shm::DoorAnswer::Kind::no_own_segment:
      break;
  }
  problem = fmt::format("there is no shared-memory segment {}", o.shm_name);
  return trusted(shm::Segment::open(o.shm_name));
}

Claimed claim_slot(Client::State& state, shm::Segment& segment, Clock::time_point deadline) {
  void* base = segment.base();
  shm::Header& h = *shm::header_at(base);
  const auto pid = static_cast<std::uint32_t>(state.pid);
  const AttachOptions& o = state.options;

  std::uint32_t index = 0;
  for (; index < h.max_apps; ++index) {
    std::uint64_t expected = shm::claim_word(SlotState::free, 0);
    if (shm::slot_at(base, index)
            ->claim.compare_exchange_strong(expected, shm::claim_word(SlotState::claiming, pid),
                                            std::memory_order_acq_rel)) {
      break;
    }
  }
  if (index == h.max_apps) {
    throw Error(Errc::resource_exhausted,
                fmt::format("all {} app slots of gradlaned (pid {}) serving {} are taken: restart it with a "
                            "larger --max-apps, or detach idle clients",
                            h.max_apps, h.daemon_pid, segment.name()));
  }
  shm::AppSlot& slot = *shm::slot_at(base, index);
  slot.owner_start_time = state.start_time;
  slot.job = o.job;
  slot.endpoint = o.endpoint;
  slot.region_bytes = o.region_bytes;
  slot.take_over = o.take_over_at ? *o.take_over_at + 1 : 0;
  slot.slots = o.slots;
  const GrantKey key = o.grant_key.value_or(GrantKey{});
  std::copy(key.begin(), key.end(), slot.grant_key);
  std::uint64_t word = shm::claim_word(SlotState::claiming, pid);
  if (!slot.claim.compare_exchange_strong(word, shm::claim_word(SlotState::attaching, pid),
                                          std::memory_order_acq_rel)) {
    return Claimed::no_answer;  // the daemon swept the claim (it thought us dead): retry
  }
  word = shm::claim_word(SlotState::attaching, pid);
  h.attach_epoch.fetch_add(1, std::memory_order_acq_rel);
  shm::ring_bell(h.daemon_sleeping, h.doorbell);

  for (;;) {
    const std::uint64_t now_word = slot.claim.load(std::memory_order_acquire);
    const SlotState s = shm::claim_state(now_word);
    if (s == SlotState::active) {
      state.header = &h;
      state.slot = &slot;
      state.slot_index = index;
      state.generation = h.generation;
      // The daemon reset both rings before the slot became free: both sides start at 0.
      state.requests = shm::RingWriter<shm::AppEntry, shm::kRingCapacity>(&slot.requests);
      state.grants = shm::RingReader<shm::GrantEntry, shm::kRingCapacity>(&slot.grants);
      state.empty_polls = 0;
      return Claimed::attached;
    }
    if (s == SlotState::rejected) {
      const auto reason = static_cast<Reason>(slot.reason.load(std::memory_order_relaxed));
      std::uint64_t rejected = now_word;
      slot.claim.compare_exchange_strong(rejected, shm::claim_word(SlotState::free, 0), std::memory_order_acq_rel);
      throw Error(Errc::invalid_argument,
                  fmt::format("gradlaned (pid {}) refused the attach to {}: {}{}", h.daemon_pid, segment.name(),
                              reason_name(reason), attach_refusal_hint(reason, h, o)));
    }
    if (s != SlotState::attaching) return Claimed::no_answer;  // swept meanwhile
    if (Clock::now() >= deadline) {
      // Give the slot back, unless the daemon accepted us in the meantime.
      std::uint64_t expected = now_word;
      if (slot.claim.compare_exchange_strong(expected, shm::claim_word(SlotState::free, 0),
                                             std::memory_order_acq_rel)) {
        return Claimed::no_answer;
      }
      continue;
    }
    await_claim_change(slot, now_word, std::chrono::milliseconds(5));
  }
}

}  // namespace

void connect(Client::State& state) {
  const AttachOptions& o = state.options;
  const auto deadline = Clock::now() + o.attach_timeout;
  std::string problem = fmt::format("there is no shared-memory segment {}", o.shm_name);
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    // Throws what retrying cannot fix: another user's segment, another user's job.
    std::optional<shm::Segment> segment = open_segment(o, problem);
    if (segment) {
      if (auto why = unusable(*segment)) {
        problem = std::move(*why);
      } else if (claim_slot(state, *segment, deadline) == Claimed::attached) {
        state.segment = std::move(segment);
        return;
      } else {
        problem =
            fmt::format("gradlaned (pid {}) did not answer the attach", shm::header_at(segment->base())->daemon_pid);
      }
    }
    if (Clock::now() >= deadline) {
      throw Error(Errc::sidecar_unavailable,
                  fmt::format("no gradlaned on this host answers at {} within {} ms: {}; {}", o.shm_name,
                              o.attach_timeout.count(), problem, start_hint(o.shm_name)));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

bool daemon_gone(const Client::State& state) {
  if (!state.attached()) return true;
  const shm::Header& h = *state.header;
  if (h.state.load(std::memory_order_acquire) != static_cast<std::uint32_t>(shm::DaemonState::running)) return true;
  if (!state.segment->locked_by_daemon()) return true;
  return std::chrono::nanoseconds(monotonic_ns() - h.heartbeat_ns.load(std::memory_order_acquire)) > kStaleHeartbeat;
}

void reattach(Client::State& state) {
  // Every request the old daemon still owed gets an answer, so none is lost silently.
  state.owed.for_each_open([&](std::uint64_t id) {
    Grant g;
    g.request = id;
    g.kind = GrantKind::error;
    g.reason = Reason::sidecar_restarted;
    g.target = static_cast<std::uint32_t>(shm::Op::submit);
    state.made_here.push_back(g);
  });
  state.owed.reset(state.next_request);
  state.header = nullptr;
  state.slot = nullptr;
  state.segment.reset();  // the old daemon is gone: nobody to tell
  if (state.options.slots != 0) {
    // A server's sequence lived in the old daemon: a new one would hand it out again from 1,
    // into slots still holding updates not yet applied. The server must stop (its replica
    // takes over), not carry on silently.
    throw Error(Errc::sidecar_unavailable,
                fmt::format("the gradlaned serving {} is gone, and this app's receiver sequence (a server, "
                            "AttachOptions::slots) went with it: a restarted gradlaned does not continue it by "
                            "itself; attach again taking it over `slots` past what was applied "
                            "(AttachOptions::take_over_at: ps::ShardServer does), or stop this server and let "
                            "its replica take over",
                            state.options.shm_name));
  }
  // A restarted daemon knows nothing of a takeover made at the old one, and the sequence has
  // moved on since: taking over again at the first version would hand out used numbers.
  state.options.take_over_at.reset();
  connect(state);
  ++state.reattachments;
}

void leave(Client::State& state) noexcept {
  if (!state.attached()) return;
  shm::AppSlot& slot = *state.slot;
  shm::Header& h = *state.header;
  const auto pid = static_cast<std::uint32_t>(state.pid);
  // From active (or evicted) to detaching; the daemon reclaims the slot and its queues.
  for (const SlotState from : {SlotState::active, SlotState::evicted}) {
    std::uint64_t expected = shm::claim_word(from, pid);
    if (slot.claim.compare_exchange_strong(expected, shm::claim_word(SlotState::detaching, pid),
                                           std::memory_order_acq_rel)) {
      h.attach_epoch.fetch_add(1, std::memory_order_acq_rel);
      shm::ring_bell(h.daemon_sleeping, h.doorbell);
      break;
    }
  }
  state.header = nullptr;
  state.slot = nullptr;
  state.segment.reset();
}

}  // namespace gradlane::sidecar
