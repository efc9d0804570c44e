// ApplyOrder: the receiving end (server or replica) of "apply strictly in granted order".
//
// The sidecar grants each update to one receiver a sequence number (1, 2, 3, … per receiver)
// and a slot of the receiver's ring of `slot_count` registered slots. Updates land in their
// slots in whatever order the network and the workers deliver them; each is announced by a
// WRITE_WITH_IMM doorbell. The receiver must nevertheless apply them in sequence order: that
// is what makes the server and its replica bitwise equal at equal versions. A granted update
// that will never come (its worker died after the grant) is cancelled by the sidecar and
// skipped in its turn, so one dead worker cannot stall the receiver.
//
// Only sequences in the window [next_sequence(), next_sequence() + slot_count) are admitted:
// the sidecar never grants further ahead than the ring can hold, so anything beyond is a
// protocol error, not something to buffer. Every refusal changes nothing and is counted by
// reason, because each one is a bug or an attack somewhere else and should be visible.
//
// Applying is two-phase: next() only looks; done() commits. The slot of the update being
// applied stays occupied until done(), so a grant for the slot's next use cannot be admitted
// into memory that the apply is still reading.
//
// Pure: no verbs, threads or clocks. Not thread-safe; one owner (the receiver's poll loop).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace gradlane::ps {

// Why an arrival or a cancel was refused (or that it was accepted).
enum class Admit : std::uint8_t {
  accepted,
  already_done,       // sequence < next_sequence(): already applied or skipped
  beyond_window,      // sequence >= next_sequence() + slot_count: the ring cannot hold it
  duplicate,          // the same arrival, or the same cancel, announced twice
  slot_out_of_range,  // slot >= slot_count
  slot_busy,          // the slot holds another sequence that is not applied yet
  already_cancelled,  // an arrival for a sequence the sidecar cancelled
  already_arrived,    // a cancel for a sequence whose update is here (it will be applied)
};
inline constexpr std::size_t kAdmitCount = 8;
std::string_view admit_name(Admit admit) noexcept;

// What the receiver has to do next, in order.
struct Step {
  enum class Kind : std::uint8_t { apply, skip };
  std::uint64_t sequence = 0;
  Kind kind = Kind::apply;
  std::uint32_t slot = 0;  // the slot to apply from; meaningless (0) for a skip
  friend bool operator==(const Step&, const Step&) = default;
};

class ApplyOrder {
 public:
  // slot_count >= 1. first_sequence: 1 for a fresh receiver; a replica taking over starts at
  // one past the last sequence it applied.
  explicit ApplyOrder(std::uint32_t slot_count, std::uint64_t first_sequence = 1);

  // A doorbell said the update for `sequence` is in `slot`.
  Admit arrived(std::uint64_t sequence, std::uint32_t slot);
  // What arrived(sequence, slot) would answer now; changes and counts nothing. A server opens
  // a slot to a writer only while this is accepted (grant windows in sidecar mode).
  Admit would_admit(std::uint64_t sequence, std::uint32_t slot) const noexcept;
  // The sidecar says `sequence` was granted but will never be written.
  Admit cancelled(std::uint64_t sequence);

  // The next step in order, or nullopt while next_sequence() has neither arrived nor been
  // cancelled (a gap: wait for its doorbell or its cancel). Calling it again returns the same
  // step until done().
  std::optional<Step> next() const;
  // Commits the step next() returned: frees its slot and advances next_sequence(). Returns
  // false and changes nothing if `step` is not that step (a caller bug).
  [[nodiscard]] bool done(const Step& step);

  std::uint64_t next_sequence() const noexcept { return next_; }
  std::uint32_t slot_count() const noexcept { return slot_count_; }
  // Sequences in the window that arrived or were cancelled and are not done yet.
  std::size_t pending() const noexcept { return pending_; }
  std::uint64_t applied() const noexcept { return applied_; }
  std::uint64_t skipped() const noexcept { return skipped_; }
  std::uint64_t refused(Admit reason) const noexcept { return refused_[static_cast<std::size_t>(reason)]; }
  std::uint64_t refused_total() const noexcept;

  // The 64-bit sequence whose low 32 bits are `imm` and which is nearest to `reference`.
  //
  // A WRITE_WITH_IMM immediate holds 32 bits, so the doorbell carries the sequence modulo
  // 2^32. The receiver passes its next_sequence() as `reference`; the result is the unique
  // s ≡ imm (mod 2^32) with reference - 2^31 <= s < reference + 2^31. That is the true
  // sequence whenever the sender's sequence is within 2^31 of the receiver's next one, which
  // always holds: a legitimate doorbell lies in [next - lateness, next + slot_count) and both
  // the window and any lateness are many orders of magnitude below 2^31. Near zero, where
  // reference - 2^31 would be negative, the candidate below zero is replaced by the one 2^32
  // above it (no sequence is negative), which then lies beyond the window and is refused.
  static std::uint64_t widen(std::uint32_t imm, std::uint64_t reference) noexcept;

 private:
  // One entry per sequence in the window, at index sequence % slot_count (a window of
  // slot_count sequences maps one to one onto the entries).
  struct Entry {
    enum class State : std::uint8_t { empty, arrived, cancelled };
    State state = State::empty;
    std::uint32_t slot = 0;
  };
  static constexpr std::uint64_t kFree = 0;  // slot holder: no sequence (sequences start at 1)

  Admit refuse(Admit reason);
  // The refusal common to arrivals and cancels, or accepted.
  Admit check_window(std::uint64_t sequence) const noexcept;
  Entry& entry(std::uint64_t sequence) { return entries_[sequence % slot_count_]; }
  const Entry& entry(std::uint64_t sequence) const { return entries_[sequence % slot_count_]; }

  std::uint32_t slot_count_;
  std::uint64_t next_;
  std::vector<Entry> entries_;
  std::vector<std::uint64_t> slot_holder_;  // per slot: the sequence in it, or kFree
  std::size_t pending_ = 0;
  std::uint64_t applied_ = 0;
  std::uint64_t skipped_ = 0;
  std::array<std::uint64_t, kAdmitCount> refused_{};
};

}  // namespace gradlane::ps
