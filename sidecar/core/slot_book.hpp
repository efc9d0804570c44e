// SlotBook: one NIC direction's timeline of granted, non-overlapping transfer slots.
//
// Used for a receiver's ingress (the receiver owns it and grants slots, like a clear-to-send)
// and for a sender's egress (the sender owns it). Updates to one server are serialized into
// these slots so each runs at the full rate of the path instead of sharing the link by
// TCP-style fairness, which delays every flow (MLNet, seed 001).
//
// Append-only on purpose: a new slot never starts before the end of the last one. At a server
// the order of slots is the order of sequence numbers, which is the order the server and its
// replica apply updates in; back-filling an earlier gap would hand out a later sequence number
// for an earlier slot and make the server wait for it. The price is an occasional idle gap,
// which the scheduler keeps small by choosing, at every step, the transfer that can finish first.
//
// It has no notion of "now" beyond what callers pass in, and no dependency on the scheduler,
// so the peer slot-agreement protocol can use it on its own (receiver side: grant(); sender
// side: reserve() the slot the receiver granted, or learn it conflicts).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "sidecar/core/types.hpp"

namespace gradlane::sched {

class SlotBook {
 public:
  // End of the last granted slot: nothing may be granted before it.
  Instant tail() const noexcept { return tail_; }
  Instant earliest_start(Instant not_before) const noexcept { return not_before > tail_ ? not_before : tail_; }

  // Grants [max(not_before, tail), + length) and returns it.
  Slot grant(Instant not_before, Nanos length);

  // Books exactly `slot` if it does not start before the tail (the sender side of the peer
  // protocol books the slot its receiver granted). Returns false and books nothing otherwise.
  bool reserve(const Slot& slot);

  // The transfer in `slot` finished at `at`. If it was the last slot and finished early, the
  // tail moves back to `at` (never before the slot's start) so the idle time can be granted
  // again. Slots granted after it are fixed and keep the tail where it is. Returns whether the
  // tail moved.
  bool finish(const Slot& slot, Instant at);

  // Forgets slots that ended at or before `t` (keeps memory bounded; the tail is unaffected).
  void retire_before(Instant t);

  // Granted slots not yet retired, in time order.
  std::span<const Slot> slots() const noexcept { return std::span<const Slot>(slots_).subspan(first_); }

 private:
  void append(const Slot& slot);

  std::vector<Slot> slots_;
  std::size_t first_ = 0;  // slots_[0, first_) are retired; compacted lazily
  Instant tail_{};
};

}  // namespace gradlane::sched
