// IngressShares: a receiver's ingress shared by concurrent transfers, each booked at a share of
// the receiver's line rate (SchedulerConfig::ingress = IngressSharing::packed).
//
// An exclusive SlotBook gives a transfer the whole receiver for its slot, so a sender at 1/4
// of the receiver's rate leaves 3/4 of it idle for the whole slot. Here a transfer books the
// share it can use, min(1, its path rate / the receiver's rate), and transfers whose shares fit
// run side by side: the receiver's line rate is packed by concurrent grants, and no booking
// ever makes the shares in use at any instant sum above 1.
//
// Starts are append-only, as in SlotBook: a booking never starts before the last one began.
// At a server the order of starts is the order of sequence numbers; the finish order may
// differ (a slow sender's update can land after a faster one granted later), and the server
// applies in sequence order anyway (it waits for holes). Because every booking began at or
// before the floor, the share in use after the floor can only fall: a share that fits at a
// start keeps fitting to the end of its slot.
#pragma once

#include <span>
#include <vector>

#include "sidecar/core/types.hpp"

namespace gradlane::sched {

class IngressShares {
 public:
  struct Booking {
    Slot slot{};
    double share = 1.0;  // of the receiver's line rate, in (0, 1]
  };

  // No booking may start before this: the start of the last one.
  Instant floor() const noexcept { return floor_; }
  // When every booking has ended.
  Instant idle_from() const noexcept;
  // The share in use at `t` (t >= floor()).
  double used_at(Instant t) const noexcept;
  // The earliest instant at or after max(not_before, floor()) when `share` (clamped to (0, 1])
  // is free for good.
  Instant earliest(Instant not_before, double share) const noexcept;

  // Books `share` over `slot` if it starts no earlier than earliest(slot.start, share);
  // returns false and books nothing otherwise.
  bool book(const Slot& slot, double share);
  // The transfer in `slot` finished at `at` (never before its start): its share is free from
  // then on. Returns whether the booking was found and shortened.
  bool finish(const Slot& slot, Instant at);
  // Forgets bookings that ended at or before `t`.
  void retire_before(Instant t);

  // Live bookings, in the order of their ends.
  std::span<const Booking> bookings() const noexcept { return bookings_; }

  // Shares are compared with this slack, so shares that sum to exactly 1 in reals fit.
  static constexpr double kSlack = 1e-9;
  static double clamp(double share) noexcept;

 private:
  void insert(const Booking& b);

  std::vector<Booking> bookings_;  // sorted by slot.end
  Instant floor_{};
};

}  // namespace gradlane::sched
