// Fuzz target: gradlaned's side of one application's shared-memory slot, the application hostile.
//
// The application owns the request ring's slots and `tail`, and the grant ring's `head`, and can
// write anything there at any time. The daemon pops requests with the real RingReader, checks
// each entry with the real entry_check.cpp exactly as Daemon::handle dispatches them, and pushes
// grants with the real RingWriter. The input is a stream of the application's moves:
//
//   limits   job u32, endpoint u32, region_bytes u64, max_update_bytes u64 (the attach args)
//   then, until the input ends, a u8 action and its operands:
//     0 push_entry    64-byte AppEntry, pushed with the client's own RingWriter (well-behaved)
//     1 write_slot    u8 slot index, 64-byte AppEntry written straight into the ring (hostile)
//     2 publish_tail  a hostile request-ring tail (see hostile_index)
//     3 drain         u8: the daemon pops up to n % 16 + 1 entries and checks each
//     4 push_grants   64-byte GrantEntry, u8 n: the daemon pushes it n + 1 times, request ids
//                     numbered on (so a full ring is a few bytes of input away)
//     5 publish_head  a hostile grant-ring head
//
// What must hold (a violation aborts, so libFuzzer keeps the input):
//   - every check agrees with the entry contract in layout.hpp, restated below without the
//     checker's overflow-avoiding arithmetic (128-bit sums), in both directions: nothing
//     malformed passes, nothing well-formed is refused;
//   - the reader and the writer answer (ok / empty / full / corrupt, and the writer's backlog)
//     exactly as a model of ring.hpp's protocol does: cached peer index, read again only when
//     the cache says empty / full, more than a ring (or less than nothing) in between = corrupt;
//   - the reader hands out exactly the bytes of the slot its head points at, publishes its head,
//     and never consumes past any tail the app published; the writer publishes its tail, puts
//     the entry where it says, and never runs more than a ring ahead of any published head;
//   - no slot index ever leaves the ring (AddressSanitizer: the rings are a real heap object).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include "fuzz_util.hpp"
#include "sidecar/daemon/entry_check.hpp"
#include "sidecar/shm/layout.hpp"

namespace gradlane::fuzz {
namespace {

namespace shm = sidecar::shm;
using sidecar::AppLimits;
using sidecar::Reason;
using Wide = unsigned __int128;

constexpr std::uint64_t kCapacity = shm::kRingCapacity;

// ---- the entry contract (layout.hpp), restated ----

bool envelope_is_valid(const shm::AppEntry& e) {
  const auto op = static_cast<std::uint8_t>(e.op);
  // flags: a submit may say it is direct-only (bit 0); nothing else has flags.
  const std::uint8_t allowed = op == 1 ? 1 : 0;
  return e.format == shm::kEntryFormat && op >= 1 && op <= 4 && (e.flags & ~allowed) == 0;
}

bool all_zero(const std::uint64_t (&words)[4]) {
  for (const std::uint64_t w : words) {
    if (w != 0) return false;
  }
  return true;
}

bool submit_is_valid(const shm::AppEntry& e, const AppLimits& l) {
  const auto& s = e.body.submit;
  return e.job == l.job && s.bytes != 0 && s.bytes <= l.max_update_bytes &&
         Wide{s.region_offset} + s.bytes <= Wide{l.region_bytes} && std::isfinite(s.gradient_norm) &&
         s.gradient_norm >= 0.0F && s.receiver != l.endpoint;
}

bool complete_is_valid(const shm::AppEntry& e) {
  return all_zero(e.body.complete.reserved) && e.body.complete.failed <= 1;
}

bool applied_is_valid(const shm::AppEntry& e, const AppLimits& l) {
  const auto& a = e.body.applied;
  return a.reserved0 == 0 && all_zero(a.reserved) && e.job == l.job && a.receiver == l.endpoint;
}

// A refusal becomes an error grant carrying the reason: it must be one an app can act on.
void require_error_reason(const std::optional<Reason>& reason) {
  require(!reason || (*reason != Reason::none && *reason != Reason::stale && *reason != Reason::peer_lost &&
                      *reason != Reason::receiver_moved),
          "a refused entry got a reason that is not an error");
}

// One popped entry, dispatched as Daemon::handle (sidecar/daemon/routing.cpp) dispatches it.
void check_entry(const shm::AppEntry& e, const AppLimits& limits) {
  const auto envelope = sidecar::check_envelope(e);
  require_error_reason(envelope);
  require(!envelope == envelope_is_valid(e), "check_envelope disagrees with the entry contract");
  if (envelope) return;
  std::optional<Reason> body;
  bool valid = false;
  if (e.op == shm::Op::submit) {
    body = sidecar::check_submit(e, limits);
    valid = submit_is_valid(e, limits);
  } else if (e.op == shm::Op::applied) {
    body = sidecar::check_applied(e, limits);
    valid = applied_is_valid(e, limits);
  } else {
    body = sidecar::check_complete(e);
    valid = complete_is_valid(e);
  }
  require_error_reason(body);
  require(!body == valid, "an entry check disagrees with the entry contract");
}

// A hostile index: near the other side's (so the plausibility edges are a mutation away) or any
// 64-bit value.
std::uint64_t hostile_index(Input& in, std::uint64_t near) {
  switch (in.take<std::uint8_t>() % 3) {
    case 0:
      return near + in.take<std::uint16_t>();
    case 1:
      return near - in.take<std::uint16_t>();
    default:
      return in.take<std::uint64_t>();
  }
}

// The app's attach arguments and the daemon's update limit.
AppLimits read_limits(Input& in) {
  return {.job = in.take<std::uint32_t>(),
          .endpoint = in.take<std::uint32_t>(),
          .region_bytes = in.take<std::uint64_t>(),
          .max_update_bytes = in.take<std::uint64_t>()};
}

// One application slot's two rings, as the segment holds them (value-initialised: all zero).
struct Rings {
  shm::RequestRing requests;
  shm::GrantRing grants;
};

class Session {
 public:
  explicit Session(const AppLimits& limits)
      : limits_(limits),
        rings_(std::make_unique<Rings>()),
        app_(&rings_->requests),
        reader_(&rings_->requests),
        granter_(&rings_->grants) {}

  void push_entry(const shm::AppEntry& e) {
    (void)app_.push(e);  // the app's own writer; full or corrupt is the app's business
    note_tail();
  }

  void write_slot(std::uint8_t index, const shm::AppEntry& e) {
    static_assert(kCapacity == 256, "a u8 index covers every slot");
    rings_->requests.slots[index] = e;
  }

  void publish_tail(std::uint64_t tail) {
    rings_->requests.tail.store(tail);
    note_tail();
  }

  void drain(unsigned n) {
    auto& ring = rings_->requests;
    for (unsigned i = 0; i < n; ++i) {
      const shm::AppEntry expected = ring.slots[popped_ % kCapacity];
      const std::uint64_t head = ring.head.load();
      const shm::RingStatus want = reader_model();
      shm::AppEntry entry{};
      const shm::RingStatus got = reader_.pop(entry);
      require(got == want, "the reader's answer is not the ring protocol's");
      if (got != shm::RingStatus::ok) {
        require(ring.head.load() == head, "a refused pop moved the head");
        return;  // empty; or corrupt, where the daemon evicts the app (the input carries on)
      }
      ++popped_;
      require(ring.head.load() == popped_, "the reader did not publish its head");
      require(popped_ <= max_tail_, "the reader consumed an entry no tail ever published");
      require(std::memcmp(&entry, &expected, sizeof entry) == 0, "the reader handed out another slot's bytes");
      check_entry(entry, limits_);
    }
  }

  void push_grant(const shm::GrantEntry& g) {
    auto& ring = rings_->grants;
    const shm::RingStatus want = writer_model();
    const shm::RingStatus got = granter_.push(g);
    require(got == want, "the writer's answer is not the ring protocol's");
    if (got == shm::RingStatus::ok) {
      ++pushed_;
      require(ring.tail.load() == pushed_, "the writer did not publish its tail");
      require(std::memcmp(&ring.slots[(pushed_ - 1) % kCapacity], &g, sizeof g) == 0,
              "the writer put the entry in another slot");
      require(pushed_ <= kCapacity || pushed_ - kCapacity <= max_head_,
              "the writer ran more than a ring ahead of every head the app published");
    }
    // backlog() takes a fresh look at the head too, keeping it only if plausible.
    if (const std::uint64_t h = ring.head.load(); h <= pushed_ && pushed_ - h <= kCapacity) seen_head_ = h;
    require(granter_.backlog() == pushed_ - seen_head_, "the writer's backlog is not the ring protocol's");
  }

  void publish_head(std::uint64_t head) {
    rings_->grants.head.store(head);
    max_head_ = std::max(max_head_, head);
  }

  std::uint64_t popped() const noexcept { return popped_; }
  std::uint64_t pushed() const noexcept { return pushed_; }

 private:
  void note_tail() { max_tail_ = std::max(max_tail_, rings_->requests.tail.load()); }

  // ring.hpp's protocol as a model: each side caches the other's index and reads it again only
  // when its cached view says empty (reader) or full (writer); a published index that would put
  // more than a ring, or less than nothing, between the two is corrupt and changes nothing.
  shm::RingStatus reader_model() {
    if (popped_ != seen_tail_) return shm::RingStatus::ok;
    const std::uint64_t tail = rings_->requests.tail.load();
    if (tail == popped_) return shm::RingStatus::empty;
    if (tail < popped_ || tail - popped_ > kCapacity) return shm::RingStatus::corrupt;
    seen_tail_ = tail;
    return shm::RingStatus::ok;
  }
  shm::RingStatus writer_model() {
    if (pushed_ - seen_head_ < kCapacity) return shm::RingStatus::ok;
    const std::uint64_t head = rings_->grants.head.load();
    if (head > pushed_ || pushed_ - head > kCapacity) return shm::RingStatus::corrupt;
    seen_head_ = head;
    return pushed_ - head >= kCapacity ? shm::RingStatus::full : shm::RingStatus::ok;
  }

  AppLimits limits_;
  std::unique_ptr<Rings> rings_;
  shm::RingWriter<shm::AppEntry, shm::kRingCapacity> app_;        // the application's
  shm::RingReader<shm::AppEntry, shm::kRingCapacity> reader_;     // the daemon's
  shm::RingWriter<shm::GrantEntry, shm::kRingCapacity> granter_;  // the daemon's
  std::uint64_t popped_ = 0;
  std::uint64_t pushed_ = 0;
  std::uint64_t max_tail_ = 0;
  std::uint64_t max_head_ = 0;
  std::uint64_t seen_tail_ = 0;  // the reader model's cached tail
  std::uint64_t seen_head_ = 0;  // the writer model's cached head
};

}  // namespace
}  // namespace gradlane::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradlane::fuzz;
  Input in(as_bytes(data, size));
  Session session(read_limits(in));
  in.for_each_action(6, [&](unsigned action) {
    switch (action) {
      case 0:
        session.push_entry(in.record<shm::AppEntry>());
        break;
      case 1: {
        const auto index = in.take<std::uint8_t>();
        session.write_slot(index, in.record<shm::AppEntry>());
        break;
      }
      case 2:
        session.publish_tail(hostile_index(in, session.popped()));
        break;
      case 3:
        session.drain(in.take<std::uint8_t>() % 16U + 1U);
        break;
      case 4: {
        shm::GrantEntry grant = in.record<shm::GrantEntry>();
        for (unsigned n = in.take<std::uint8_t>() + 1U; n > 0; --n, ++grant.request) session.push_grant(grant);
        break;
      }
      default:
        session.publish_head(hostile_index(in, session.pushed()));
        break;
    }
  });
  return 0;
}
