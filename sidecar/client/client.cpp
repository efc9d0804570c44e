// gradlane::sidecar::Client — the calls an application makes (attach protocol: attach.cpp).
//
// Hot path (request / poll): one load of the daemon state and of our claim word (both
// read-mostly lines), a ring push or pop, and — only if the daemon sleeps — a futex wake.
// Every liveness question that costs a system call is asked only when waiting.
#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <thread>

#include "gradlane/sidecar.hpp"
#include "sidecar/client/client_state.hpp"
#include "sidecar/shm/futex.hpp"
#include "sidecar/shm/process.hpp"

namespace gradlane::sidecar {
namespace {

using Clock = std::chrono::steady_clock;
using shm::SlotState;

// The wire enum and the public one are the same numbers (to_grant casts between them).
static_assert(static_cast<int>(GrantKind::go) == static_cast<int>(shm::GrantKind::go) &&
              static_cast<int>(GrantKind::drop) == static_cast<int>(shm::GrantKind::drop) &&
              static_cast<int>(GrantKind::redirect) == static_cast<int>(shm::GrantKind::redirect) &&
              static_cast<int>(GrantKind::aggregate) == static_cast<int>(shm::GrantKind::aggregate) &&
              static_cast<int>(GrantKind::error) == static_cast<int>(shm::GrantKind::error) &&
              static_cast<int>(GrantKind::cancel) == static_cast<int>(shm::GrantKind::cancel));

// Empty polls between two clock reads in poll(): a poll loop checks the daemon's liveness
// (a flock probe, a system call) once per kLivenessEvery of wall time, however slow or fast
// the caller polls — counting polls alone (4,096 of them) took 3 s in a server whose loop
// does real work per round, and its exit on a dead gradlaned came 6.2 s after the death.
constexpr std::uint32_t kPollsPerClockRead = 64;

std::uint64_t env_number(const char* name, std::uint64_t min, std::uint64_t max, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr) return fallback;
  std::uint64_t value = 0;
  const char* end = text + std::char_traits<char>::length(text);
  const auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc{} || ptr != end || ptr == text || value < min || value > max) {
    throw Error(Errc::invalid_argument, fmt::format("{}='{}' is not a number in [{}, {}]", name, text, min, max));
  }
  return value;
}

Client::State& live(const std::unique_ptr<Client::State>& state) {
  if (!state) throw Error(Errc::invalid_argument, "this sidecar Client was moved from");
  return *state;
}

// Before every call: reattach if the daemon stopped or restarted; fail if it evicted us.
void ensure_attached(Client::State& s) {
  if (!s.attached() ||
      s.header->state.load(std::memory_order_acquire) != static_cast<std::uint32_t>(shm::DaemonState::running)) {
    reattach(s);
    return;
  }
  const std::uint64_t word = s.slot->claim.load(std::memory_order_acquire);
  if (shm::claim_state(word) == SlotState::active) return;
  if (shm::claim_state(word) == SlotState::evicted) {
    const auto reason = static_cast<Reason>(s.slot->reason.load(std::memory_order_relaxed));
    throw Error(Errc::protocol, fmt::format("gradlaned evicted this app from {} ({}): its queues were overwritten; "
                                            "detach and attach again",
                                            s.options.shm_name, reason_name(reason)));
  }
  // Freed under us: the daemon took us for dead (e.g. another pid namespace). Start over.
  reattach(s);
}

void push(Client::State& s, const shm::AppEntry& entry, std::chrono::nanoseconds wait_for_space) {
  ensure_attached(s);
  // The clock is read only once the queue is full: on a VM a clock read costs as much as the
  // rest of the push.
  std::optional<Clock::time_point> deadline;
  Clock::time_point next_liveness{};
  for (;;) {
    const shm::RingStatus status = s.requests.push(entry);
    if (status == shm::RingStatus::ok) {
      shm::ring_bell(s.header->daemon_sleeping, s.header->doorbell);
      return;
    }
    if (status == shm::RingStatus::corrupt) {
      throw Error(Errc::protocol, fmt::format("the request queue to gradlaned ({}) is corrupted: its read "
                                              "index was overwritten; detach and attach again",
                                              s.options.shm_name));
    }
    const auto now = Clock::now();
    if (!deadline) {
      deadline = now + wait_for_space;
      next_liveness = now + kLivenessEvery;
    }
    if (now >= *deadline) {
      throw Error(Errc::resource_exhausted,
                  fmt::format("the request queue to gradlaned ({}) is full ({} entries): the daemon is "
                              "behind, or this app does not read its grants (poll()/wait()); nothing was "
                              "queued — retry, or pass a wait_for_space",
                              s.options.shm_name, shm::kRingCapacity));
    }
    if (now >= next_liveness) {
      if (daemon_gone(s)) reattach(s);  // a new daemon starts with an empty queue
      next_liveness = now + kLivenessEvery;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Grant to_grant(const shm::GrantEntry& e) {
  if (e.format != shm::kEntryFormat || e.kind < shm::GrantKind::go || e.kind > shm::GrantKind::cancel) {
    throw Error(Errc::protocol, fmt::format("gradlaned sent a grant this library cannot read (format {}, "
                                            "kind {}): run a gradlaned from the same release",
                                            e.format, static_cast<unsigned>(e.kind)));
  }
  Grant g;
  g.request = e.request;
  g.kind = static_cast<GrantKind>(e.kind);
  g.reason = static_cast<Reason>(e.reason);
  g.target = e.target;
  g.sequence = e.sequence;
  g.slot_start = std::chrono::nanoseconds(e.slot_start_ns);
  g.slot_length = std::chrono::nanoseconds(e.slot_length_ns);
  g.part_offset = e.part_offset;
  g.part_bytes = e.part_bytes;
  g.part_index = e.part_index;
  g.part_count = e.part_count;
  g.token = e.token;
  return g;
}

// Keeps `owed` to the requests still waiting for an answer (for the restart guarantee).
void account(Client::State& s, const Grant& g) {
  switch (g.kind) {
    case GrantKind::go:
    case GrantKind::redirect:
    case GrantKind::drop: {
      OwedWindow::Owed* owed = s.owed.find(g.request);
      if (owed == nullptr) return;
      owed->part_count = g.part_count;
      if (++owed->decided >= g.part_count) s.owed.close(g.request);
      return;
    }
    case GrantKind::error:
      if (g.target == static_cast<std::uint32_t>(shm::Op::submit)) s.owed.close(g.request);
      return;
    case GrantKind::aggregate:
    case GrantKind::cancel:
      return;
  }
}

std::optional<Grant> take(Client::State& s) {
  if (!s.made_here.empty()) {
    Grant g = s.made_here.front();
    s.made_here.pop_front();
    return g;
  }
  if (!s.attached()) return std::nullopt;
  shm::GrantEntry e;
  switch (s.grants.pop(e)) {
    case shm::RingStatus::ok: {
      Grant g = to_grant(e);
      account(s, g);
      return g;
    }
    case shm::RingStatus::corrupt:
      throw Error(Errc::protocol, fmt::format("the grant queue from gradlaned ({}) is corrupted: its write "
                                              "index was overwritten; detach and attach again",
                                              s.options.shm_name));
    case shm::RingStatus::empty:
    case shm::RingStatus::full:
      break;
  }
  return std::nullopt;
}

}  // namespace

std::string default_shm_name() {
  if (const char* name = std::getenv("GRADLANE_SIDECAR_SHM"); name != nullptr && *name != '\0') return name;
  return fmt::format("/gradlane-{}", ::getuid());
}

AttachOptions AttachOptions::from_env() {
  AttachOptions o;
  shm::check_shm_name(o.shm_name, "GRADLANE_SIDECAR_SHM");
  o.attach_timeout = std::chrono::milliseconds(
      env_number("GRADLANE_SIDECAR_TIMEOUT_MS", 1, 3'600'000, static_cast<std::uint64_t>(o.attach_timeout.count())));
  o.spin = std::chrono::microseconds(
      env_number("GRADLANE_SIDECAR_SPIN_US", 0, 1'000'000, static_cast<std::uint64_t>(o.spin.count())));
  return o;
}

Client Client::attach(AttachOptions options) {
  shm::check_shm_name(options.shm_name, "AttachOptions::shm_name");
  if (options.region_bytes == 0) {
    throw Error(Errc::invalid_argument,
                "AttachOptions::region_bytes is 0: pass the size of the registered gradient region "
                "(request offsets are checked against it)");
  }
  if (options.attach_timeout <= std::chrono::milliseconds::zero()) {
    throw Error(Errc::invalid_argument, "AttachOptions::attach_timeout must be positive");
  }
  if (options.grant_key && options.slots == 0 && !options.take_over_at) {
    throw Error(Errc::invalid_argument,
                "AttachOptions::grant_key is for a server app (one that sets slots or take_over_at): only the "
                "receiver's server checks the tokens of its grants");
  }
  auto state = std::make_unique<State>();
  state->options = std::move(options);
  state->pid = ::getpid();
  state->start_time = process_start_time(state->pid).value_or(0);
  connect(*state);
  return Client(std::move(state));
}

Client::Client(std::unique_ptr<State> state) noexcept : state_(std::move(state)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&& other) noexcept {
  if (this != &other) {
    detach();
    state_ = std::move(other.state_);
  }
  return *this;
}
Client::~Client() { detach(); }

std::uint64_t Client::request(const Update& u, std::chrono::nanoseconds wait_for_space) {
  State& s = live(state_);
  const std::uint64_t id = s.next_request;
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::submit;
  e.flags = u.direct_only ? shm::kSubmitDirectOnly : 0;
  e.job = s.options.job;
  e.request = id;
  e.body.submit = shm::AppEntry::Submit{.tensor = u.tensor,
                                        .receiver = u.receiver,
                                        .bytes = u.bytes,
                                        .region_offset = u.region_offset,
                                        .computed_on = u.computed_on,
                                        .gradient_norm = u.gradient_norm,
                                        .priority = u.priority,
                                        .job_remaining = u.job_remaining};
  push(s, e, wait_for_space);
  ++s.next_request;
  s.owed.add(id);
  return id;
}

void Client::complete(std::uint64_t request, std::uint32_t part, std::chrono::nanoseconds wire_time, bool failed,
                      std::chrono::nanoseconds wait_for_space) {
  State& s = live(state_);
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::complete;
  e.job = s.options.job;
  e.request = request;
  e.body.complete =
      shm::AppEntry::Complete{.part = part,
                              .failed = failed ? 1U : 0U,
                              .measured_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(wire_time.count(), 0)),
                              .reserved = {}};
  push(s, e, wait_for_space);
}

void Client::complete_aggregate(std::uint64_t aggregate, std::chrono::nanoseconds wire_time, bool failed) {
  State& s = live(state_);
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::complete_aggregate;
  e.job = s.options.job;
  e.request = aggregate;
  e.body.complete =
      shm::AppEntry::Complete{.part = 0,
                              .failed = failed ? 1U : 0U,
                              .measured_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(wire_time.count(), 0)),
                              .reserved = {}};
  push(s, e, std::chrono::nanoseconds{0});
}

void Client::applied(std::uint64_t through) {
  State& s = live(state_);
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::applied;
  e.job = s.options.job;
  e.body.applied =
      shm::AppEntry::Applied{.receiver = s.options.endpoint, .reserved0 = 0, .through = through, .reserved = {}};
  push(s, e, std::chrono::nanoseconds{0});
}

std::optional<Grant> Client::poll() {
  State& s = live(state_);
  ensure_attached(s);
  if (auto g = take(s)) {
    s.empty_polls = 0;
    return g;
  }
  if (++s.empty_polls >= kPollsPerClockRead) {
    s.empty_polls = 0;
    const auto now = Clock::now();
    if (now < s.next_liveness_poll) return std::nullopt;
    s.next_liveness_poll = now + kLivenessEvery;
    if (daemon_gone(s)) {
      reattach(s);
      return take(s);  // the sidecar_restarted answers, if anything was owed
    }
  }
  return std::nullopt;
}

Grant Client::wait(std::chrono::nanoseconds timeout) {
  State& s = live(state_);
  ensure_attached(s);
  if (auto g = take(s)) return *g;  // the common case when the app polls late: no clock read
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const auto spin_until = start + s.options.spin;
  auto next_liveness = start + kLivenessEvery;
  for (;;) {
    ensure_attached(s);
    if (auto g = take(s)) return *g;
    const auto now = Clock::now();
    if (now >= deadline) {
      throw Error(Errc::timeout,
                  fmt::format("no answer from gradlaned ({}) within {} us ({} requests "
                              "outstanding)",
                              s.options.shm_name,
                              std::chrono::duration_cast<std::chrono::microseconds>(timeout).count(), s.owed.size()));
    }
    if (now >= next_liveness) {
      next_liveness = now + kLivenessEvery;
      if (daemon_gone(s)) {
        reattach(s);
        continue;
      }
    }
    if (now < spin_until) {
      shm::back_off(now - start);
      continue;
    }
    // Sleep (eventcount, see futex.hpp): the daemon rings our bell after publishing a grant.
    shm::AppSlot& slot = *s.slot;
    const std::uint32_t seen = slot.grant_bell.load(std::memory_order_acquire);
    slot.app_sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!s.grants.ready()) {
      const auto until = std::min(deadline, next_liveness);
      shm::futex_wait(slot.grant_bell, seen, until - now);
    }
    slot.app_sleeping.store(0, std::memory_order_relaxed);
  }
}

void Client::detach() noexcept {
  if (state_) leave(*state_);
}

bool Client::attached() const noexcept { return state_ && state_->attached(); }
std::uint32_t Client::slot() const noexcept { return state_ ? state_->slot_index : 0; }
std::uint64_t Client::sidecar_generation() const noexcept { return state_ ? state_->generation : 0; }
std::uint64_t Client::reattachments() const noexcept { return state_ ? state_->reattachments : 0; }
std::size_t Client::outstanding() const noexcept { return state_ ? state_->owed.size() : 0; }

std::string_view kind_name(GrantKind kind) noexcept {
  switch (kind) {
    case GrantKind::go:
      return "go";
    case GrantKind::drop:
      return "drop";
    case GrantKind::redirect:
      return "redirect";
    case GrantKind::aggregate:
      return "aggregate";
    case GrantKind::error:
      return "error";
    case GrantKind::cancel:
      return "cancel";
  }
  return "unknown";
}

std::string_view reason_name(Reason reason) noexcept {
  switch (reason) {
    case Reason::none:
      return "none";
    case Reason::stale:
      return "stale";
    case Reason::peer_lost:
      return "peer_lost";
    case Reason::receiver_moved:
      return "receiver_moved";
    case Reason::peer_refused:
      return "peer_refused";
    case Reason::unknown_job:
      return "unknown_job";
    case Reason::bad_size:
      return "bad_size";
    case Reason::bad_offset:
      return "bad_offset";
    case Reason::bad_format:
      return "bad_format";
    case Reason::unknown_fields:
      return "unknown_fields";
    case Reason::bad_value:
      return "bad_value";
    case Reason::duplicate_request:
      return "duplicate_request";
    case Reason::unknown_request:
      return "unknown_request";
    case Reason::too_many_outstanding:
      return "too_many_outstanding";
    case Reason::bad_receiver:
      return "bad_receiver";
    case Reason::version_from_future:
      return "version_from_future";
    case Reason::receiver_unreachable:
      return "receiver_unreachable";
    case Reason::unknown_receiver:
      return "unknown_receiver";
    case Reason::sidecar_restarted:
      return "sidecar_restarted";
    case Reason::bad_attach:
      return "bad_attach";
    case Reason::owner_mismatch:
      return "owner_mismatch";
    case Reason::corrupt_ring:
      return "corrupt_ring";
    case Reason::unknown_endpoint:
      return "unknown_endpoint";
    case Reason::bad_takeover:
      return "bad_takeover";
    case Reason::own_segment:
      return "own_segment";
    case Reason::receiver_of_another_job:
      return "receiver_of_another_job";
  }
  return "unknown";
}

}  // namespace gradlane::sidecar
