// Fuzz target: what a parameter-server receiver takes from its peers, the peers hostile — the
// control messages (ps/protocol/messages.cpp) and the WRITE_WITH_IMM doorbells, whose 32-bit
// immediate is widened to a sequence and admitted by the real ApplyOrder (apply_order.cpp), as
// ShardServer::take_from does. The input is a receiver's configuration and then a stream of
// arrivals:
//
//   slots u8 (ring of slots % 64 + 1), first sequence u64 (% 2^62 + 1)
//   then, until the input ends, a u8 action and its operands:
//     0 message   u8 length, that many bytes: one received control message
//     1 doorbell  u32 immediate; the update goes in slot sequence % slots (the server's rule)
//     2 doorbell  u32 immediate, u32 slot (any slot: a hostile or buggy granter)
//     3 cancel    i16: the sequence next + i16 is cancelled
//     4 apply     take the next step, after first offering done() a wrong one
//     5 widen     u32 immediate, u64 reference (% 2^63): widen() alone
//
// What must hold (a violation aborts, so libFuzzer keeps the input):
//   - decode() returns or throws gradlane::Error(protocol); a message that decodes re-encodes to
//     exactly its bytes, a worker's hello names a worker id other than 0, and a claim names a
//     sequence and a token (neither 0);
//   - widen() returns the sequence apply_order.hpp specifies (computed here in 128 bits);
//   - ApplyOrder matches a model of its documented contract: every admission and refusal
//     reason, the step it offers, and its counters; done() refuses a step it did not offer.
//     Sequences stay below 2^63 here: they count updates from 1 and never get near 2^64.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <variant>

#include "fuzz_util.hpp"
#include "gradlane/error.hpp"
#include "ps/receiving/apply_order.hpp"
#include "ps/protocol/messages.hpp"

namespace gradlane::fuzz {
namespace {

using ps::Admit;
using ps::ApplyOrder;
using ps::Step;

void received_message(std::span<const std::byte> bytes) {
  const auto message = decoded([&] { return ps::decode(bytes); });
  if (!message) return;
  if (const auto* hello = std::get_if<ps::Hello>(&*message)) {
    require(hello->kind == ps::PeerKind::worker || hello->kind == ps::PeerKind::primary ||
                hello->kind == ps::PeerKind::replica,
            "hello from an unknown peer kind");
    require(hello->kind != ps::PeerKind::worker || hello->worker != 0, "hello from worker id 0");
    require(hello->kind != ps::PeerKind::replica || hello->worker == 0, "hello from a joining replica with an id");
    require(hello->addressed == ps::Addressed::server || hello->addressed == ps::Addressed::replica,
            "hello addressed to an unknown role");
  }
  if (const auto* forwarded = std::get_if<ps::Forwarded>(&*message)) {
    require(forwarded->delivered == (forwarded->sequence != 0),
            "a delivered member without its sequence, or the reverse");
  }
  if (const auto* at = std::get_if<ps::ListeningAt>(&*message)) {
    require(at->kind == ps::PeerKind::replica || at->kind == ps::PeerKind::aggregator, "listening-at for another kind");
    require(!at->address.empty() && at->port != 0, "a listening address empty or its port 0");
    for (const char c : at->address) {
      require(std::isxdigit(static_cast<unsigned char>(c)) != 0 || c == '.' || c == ':',
              "an address with a foreign byte");
    }
  }
  if (const auto* mirroring = std::get_if<ps::Mirroring>(&*message)) {
    require(mirroring->worker != 0 && mirroring->from != 0, "mirroring from worker 0 or sequence 0");
  }
  if (const auto* claim = std::get_if<ps::Claim>(&*message)) {
    require(claim->sequence != 0, "a claim of sequence 0");
  }
  if (const auto* opened = std::get_if<ps::Opened>(&*message)) {
    require(opened->sequence != 0, "an answer to a claim of sequence 0");
  }
  if (const auto* ask = std::get_if<ps::AskLanded>(&*message)) require(ask->worker != 0, "ask-landed from worker id 0");
  if (const auto* landed = std::get_if<ps::Landed>(&*message)) {
    require(landed->sequence != 0 || (landed->tag == 0 && landed->computed_on == 0),
            "landed: no update (sequence 0) with a tag or a version");
  }
  if (const auto* refused = std::get_if<ps::Refused>(&*message)) {
    require(ps::is_known(refused->why), "refused for an unknown reason");
  }
  if (const auto* next = std::get_if<ps::Pushing>(&*message)) require(next->sequence != 0, "pushing as sequence 0");
  if (const auto* dropped = std::get_if<ps::Dropped>(&*message)) require(dropped->worker != 0, "dropped worker id 0");
  const auto again = ps::encode(*message);
  require(again.size() == bytes.size() && std::equal(again.begin(), again.end(), bytes.begin()),
          "a decoded message does not re-encode to its bytes");
}

// apply_order.hpp's definition of widen(): the s = imm (mod 2^32) with
// reference - 2^31 <= s < reference + 2^31, or 2^32 above it where that s would be negative.
std::uint64_t widen_spec(std::uint32_t imm, std::uint64_t reference) {
  using Signed = __int128;
  constexpr Signed kSpan = Signed{1} << 32;
  const Signed ref = reference;
  Signed s = (ref & ~(kSpan - 1)) | imm;
  if (s < ref - kSpan / 2) s += kSpan;
  if (s >= ref + kSpan / 2) s -= kSpan;
  if (s < 0) s += kSpan;
  return static_cast<std::uint64_t>(s);
}

std::uint64_t widen(std::uint32_t imm, std::uint64_t reference) {
  const std::uint64_t s = ApplyOrder::widen(imm, reference);
  require(s == widen_spec(imm, reference), "widen() is not the documented nearest sequence");
  return s;
}

// The receiver and a model of ApplyOrder's contract beside it.
class Receiver {
 public:
  Receiver(std::uint32_t slots, std::uint64_t first)
      : order_(slots, first), slots_(slots), first_(first), next_(first) {}

  // The configuration at the input's start: slots u8 (% 64 + 1), first sequence u64 (% 2^62 + 1).
  static Receiver read(Input& in) {
    const std::uint32_t slots = in.take<std::uint8_t>() % 64U + 1U;
    return Receiver(slots, in.take<std::uint64_t>() % (std::uint64_t{1} << 62) + 1);
  }

  std::uint64_t next() const noexcept { return next_; }
  std::uint32_t slots() const noexcept { return slots_; }

  void arrived(std::uint64_t sequence, std::uint32_t slot) {
    const Admit got = order_.arrived(sequence, slot);
    Admit want = window(sequence);
    if (want == Admit::accepted) {
      if (const auto it = pending_.find(sequence); it != pending_.end()) {
        want = it->second ? Admit::duplicate : Admit::already_cancelled;
      } else if (slot >= slots_) {
        want = Admit::slot_out_of_range;
      } else if (holder_.contains(slot)) {
        want = Admit::slot_busy;
      }
    }
    require(got == want, "ApplyOrder::arrived admitted or refused against its contract");
    if (got == Admit::accepted) {
      pending_[sequence] = slot;
      holder_[slot] = sequence;
      // A doorbell counts once: the same one again must be refused.
      require(order_.arrived(sequence, slot) == Admit::duplicate, "a repeated doorbell was not refused as a duplicate");
    }
    ++refused_;  // the refusal, or the repeat's
    check_counters();
  }

  void cancelled(std::uint64_t sequence) {
    const Admit got = order_.cancelled(sequence);
    Admit want = window(sequence);
    if (want == Admit::accepted) {
      if (const auto it = pending_.find(sequence); it != pending_.end()) {
        want = it->second ? Admit::already_arrived : Admit::duplicate;
      }
    }
    require(got == want, "ApplyOrder::cancelled admitted or refused against its contract");
    if (got == Admit::accepted) {
      pending_[sequence] = std::nullopt;
    } else {
      ++refused_;
    }
    check_counters();
  }

  void apply() {
    const std::optional<Step> step = order_.next();
    const auto it = pending_.find(next_);
    if (it == pending_.end()) {
      require(!step, "ApplyOrder offered a step for a sequence that neither arrived nor was cancelled");
      return;
    }
    const Step want = it->second ? Step{next_, Step::Kind::apply, *it->second} : Step{next_, Step::Kind::skip, 0};
    require(step && *step == want, "ApplyOrder offered the wrong step");
    Step wrong = want;
    ++wrong.sequence;
    require(!order_.done(wrong) && order_.next_sequence() == next_, "done() took a step it did not offer");
    require(order_.done(want), "done() refused the step it offered");
    if (want.kind == Step::Kind::apply) {
      holder_.erase(want.slot);
      ++applied_;
    } else {
      ++skipped_;
    }
    pending_.erase(it);
    ++next_;
    check_counters();
  }

 private:
  Admit window(std::uint64_t sequence) const {
    if (sequence < next_) return Admit::already_done;
    if (sequence - next_ >= slots_) return Admit::beyond_window;
    return Admit::accepted;
  }

  void check_counters() const {
    require(order_.next_sequence() == next_, "next_sequence() moved without a done()");
    require(order_.pending() == pending_.size(), "pending() is not the count of admitted, undone sequences");
    require(order_.pending() <= slots_, "more sequences pending than the window holds");
    require(order_.applied() == applied_ && order_.skipped() == skipped_, "applied()/skipped() miscounted");
    require(order_.applied() + order_.skipped() == next_ - first_, "applied + skipped is not the sequences done");
    require(order_.refused_total() == refused_, "refused_total() is not the count of refusals");
  }

  ApplyOrder order_;
  // The model: what the contract says the order holds and has counted.
  std::uint32_t slots_;
  std::uint64_t first_;
  std::uint64_t next_;
  std::uint64_t applied_ = 0;
  std::uint64_t skipped_ = 0;
  std::uint64_t refused_ = 0;
  std::map<std::uint64_t, std::optional<std::uint32_t>> pending_;  // sequence -> slot, or cancelled
  std::map<std::uint32_t, std::uint64_t> holder_;                  // slot -> sequence in it
};

}  // namespace
}  // namespace gradlane::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradlane::fuzz;
  Input in(as_bytes(data, size));
  Receiver receiver = Receiver::read(in);
  in.for_each_action(6, [&](unsigned action) {
    switch (action) {
      case 0: {
        const auto length = in.take<std::uint8_t>();
        received_message(in.bytes(length));
        break;
      }
      case 1: {
        const std::uint64_t sequence = widen(in.take<std::uint32_t>(), receiver.next());
        receiver.arrived(sequence, static_cast<std::uint32_t>(sequence % receiver.slots()));
        break;
      }
      case 2: {
        const std::uint64_t sequence = widen(in.take<std::uint32_t>(), receiver.next());
        receiver.arrived(sequence, in.take<std::uint32_t>());
        break;
      }
      case 3:
        receiver.cancelled(receiver.next() + static_cast<std::uint64_t>(std::int64_t{in.take<std::int16_t>()}));
        break;
      case 4:
        receiver.apply();
        break;
      default: {
        const auto imm = in.take<std::uint32_t>();
        widen(imm, in.take<std::uint64_t>() % (std::uint64_t{1} << 63));
        break;
      }
    }
  });
  return 0;
}
