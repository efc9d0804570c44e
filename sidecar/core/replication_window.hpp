// ReplicationWindow: the sequence counter of one server and its replica's progress.
//
// The scheduler assigns every applied update (direct part or aggregate) the next sequence
// number; the server and the replica both apply in sequence order, so their models are
// bitwise equal at equal versions. A sequence number is never granted more than `bound` (B)
// ahead of the one the replica has acknowledged: granted - acked <= B at all times, so on a
// server failure the replica is at most B updates behind and the lost work is bounded.
// When the window is full the server's grants wait (nothing is dropped; the version does not
// advance while waiting, so no pending update grows staler).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "sidecar/core/types.hpp"

namespace gradlane::sched {

class ReplicationWindow {
 public:
  // bound: B, or nullopt for a server without a replica. start: the version the server is at
  // (0 for a fresh model; the replica's version when it takes over after a failure).
  explicit ReplicationWindow(std::optional<std::uint64_t> bound = std::nullopt, Seq start = 0) noexcept
      : bound_(bound), granted_(start), acked_(start) {}

  bool can_grant() const noexcept { return !bound_ || granted_ - acked_ < *bound_; }
  Seq next() const noexcept { return granted_ + 1; }
  // Assigns the next sequence number. Precondition: can_grant().
  Seq grant() noexcept { return ++granted_; }
  // The replica has applied every update up to `seq`. Stale acks are harmless and ignored;
  // an ack beyond what was granted is a protocol error and is rejected (returns false).
  bool ack(Seq seq) noexcept {
    if (seq > granted_) return false;
    if (seq > acked_) acked_ = seq;
    return true;
  }

  Seq granted() const noexcept { return granted_; }  // == the version after all grants apply
  Seq acked() const noexcept { return acked_; }
  std::uint64_t lag() const noexcept { return granted_ - acked_; }
  std::optional<std::uint64_t> bound() const noexcept { return bound_; }
  // Narrows the bound (a server's slot count, Scheduler::limit_window): never widens it.
  void limit(std::uint64_t bound) noexcept { bound_ = bound_ ? std::min(*bound_, bound) : bound; }

 private:
  std::optional<std::uint64_t> bound_;
  Seq granted_;
  Seq acked_;
};

}  // namespace gradlane::sched
