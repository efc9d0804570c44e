#include "sidecar/core/slot_book.hpp"

namespace gradlane::sched {

Slot SlotBook::grant(Instant not_before, Nanos length) {
  const Instant start = earliest_start(not_before);
  const Slot slot{start, start + (length > Nanos::zero() ? length : Nanos::zero())};
  append(slot);
  return slot;
}

bool SlotBook::reserve(const Slot& slot) {
  if (slot.start < tail_ || slot.end < slot.start) return false;
  append(slot);
  return true;
}

bool SlotBook::finish(const Slot& slot, Instant at) {
  if (first_ == slots_.size() || !(slots_.back() == slot) || at >= slot.end) return false;
  const Instant end = at > slot.start ? at : slot.start;
  slots_.back().end = end;
  tail_ = end;
  return true;
}

void SlotBook::retire_before(Instant t) {
  while (first_ < slots_.size() && slots_[first_].end <= t) ++first_;
  // Compact once the retired prefix dominates, so a long-lived book stays O(live slots).
  if (first_ > 64 && first_ * 2 > slots_.size()) {
    slots_.erase(slots_.begin(), slots_.begin() + static_cast<std::ptrdiff_t>(first_));
    first_ = 0;
  }
}

void SlotBook::append(const Slot& slot) {
  slots_.push_back(slot);
  tail_ = slot.end;
}

}  // namespace gradlane::sched
