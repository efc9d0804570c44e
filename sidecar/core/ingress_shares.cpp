#include "sidecar/core/ingress_shares.hpp"

#include <algorithm>

namespace gradlane::sched {

double IngressShares::clamp(double share) noexcept {
  if (!(share > 0.0)) return kSlack;  // NaN or not positive: the least a transfer can take
  return share < 1.0 ? share : 1.0;
}

Instant IngressShares::idle_from() const noexcept {
  const Instant last = bookings_.empty() ? Instant{} : bookings_.back().slot.end;
  return std::max(floor_, last);
}

double IngressShares::used_at(Instant t) const noexcept {
  double used = 0.0;
  for (const Booking& b : bookings_) {
    if (b.slot.start <= t && t < b.slot.end) used += b.share;
  }
  return used;
}

Instant IngressShares::earliest(Instant not_before, double share) const noexcept {
  share = clamp(share);
  const Instant t = std::max(not_before, floor_);
  // Every booking started at or before t, so the share in use only falls after t, at each end.
  double used = 0.0;
  auto first_live = std::upper_bound(bookings_.begin(), bookings_.end(), t,
                                     [](Instant at, const Booking& b) { return at < b.slot.end; });
  for (auto it = first_live; it != bookings_.end(); ++it) used += it->share;
  if (used + share <= 1.0 + kSlack) return t;
  for (auto it = first_live; it != bookings_.end(); ++it) {
    used -= it->share;
    if (used + share <= 1.0 + kSlack) return it->slot.end;
  }
  return idle_from();  // not reached: once every booking ended the whole line is free
}

bool IngressShares::book(const Slot& slot, double share) {
  share = clamp(share);
  if (slot.end < slot.start || earliest(slot.start, share) != slot.start) return false;
  floor_ = slot.start;
  insert(Booking{slot, share});
  return true;
}

bool IngressShares::finish(const Slot& slot, Instant at) {
  const auto it = std::find_if(bookings_.begin(), bookings_.end(), [&](const Booking& b) { return b.slot == slot; });
  if (it == bookings_.end() || at >= slot.end) return false;
  Booking shortened = *it;
  shortened.slot.end = std::max(at, slot.start);
  bookings_.erase(it);
  insert(shortened);
  return true;
}

void IngressShares::retire_before(Instant t) {
  const auto live = std::find_if(bookings_.begin(), bookings_.end(), [t](const Booking& b) { return b.slot.end > t; });
  bookings_.erase(bookings_.begin(), live);
}

void IngressShares::insert(const Booking& b) {
  const auto at = std::upper_bound(bookings_.begin(), bookings_.end(), b.slot.end,
                                   [](Instant end, const Booking& x) { return end < x.slot.end; });
  bookings_.insert(at, b);
}

}  // namespace gradlane::sched
