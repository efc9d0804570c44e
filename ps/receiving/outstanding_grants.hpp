// OutstandingGrants: the sequences granted to one worker whose doorbell has not come yet, as a
// direct-mode granter keeps them (the shard server for its workers, the aggregator for its
// members). A doorbell counts only from the worker a sequence was granted to, and only once; a
// worker that dies, or stays silent past the hole timeout, gives its sequences back as holes
// for the apply order to skip.
//
// Pure: the time is an argument. Not thread-safe; one owner (the granter's poll loop).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace gradlane::ps {

class OutstandingGrants {
 public:
  using Clock = std::chrono::steady_clock;

  void add(std::uint64_t sequence, Clock::time_point granted_at) { granted_[sequence] = granted_at; }
  // The worker's doorbell for `sequence`: true the first time, if it was granted to this worker.
  bool ring(std::uint64_t sequence) { return granted_.erase(sequence) != 0; }
  // `sequence` is no longer this worker's to write (cancelled or skipped elsewhere).
  void forget(std::uint64_t sequence) { granted_.erase(sequence); }
  // Removes and returns, in order, the sequences granted `hole_timeout` or longer before `now`.
  std::vector<std::uint64_t> expire(Clock::time_point now, Clock::duration hole_timeout) {
    std::vector<std::uint64_t> holes;
    for (auto it = granted_.begin(); it != granted_.end();) {
      if (now - it->second < hole_timeout) {
        ++it;
        continue;
      }
      holes.push_back(it->first);
      it = granted_.erase(it);
    }
    return holes;
  }
  // Whether expire(now, hole_timeout) would return anything (nothing removed).
  bool any_expired(Clock::time_point now, Clock::duration hole_timeout) const {
    for (const auto& [sequence, at] : granted_) {
      if (now - at >= hole_timeout) return true;
    }
    return false;
  }
  // Removes and returns them all, in order (the worker is gone).
  std::vector<std::uint64_t> take_all() {
    std::vector<std::uint64_t> holes;
    for (const auto& [sequence, at] : granted_) holes.push_back(sequence);
    granted_.clear();
    return holes;
  }
  bool empty() const noexcept { return granted_.empty(); }

  // A hole whose slot has no window to close: the worker's write, if it comes late (stalled
  // between its deadline check and the post, or retransmitted), lands there whenever it comes.
  // The granter keeps the slot out of use until the worker asks again: a worker asks one
  // request at a time, after it wrote or dropped every grant before and waited for those
  // writes (and its mirror's), so its next request arrives behind them on the RC connection.
  void may_still_land(std::uint64_t sequence) { may_land_.push_back(sequence); }
  // The worker asked again (or said it finished): nothing it was granted before may still land.
  void asked_again() noexcept { may_land_.clear(); }
  const std::vector<std::uint64_t>& late_writes_possible() const noexcept { return may_land_; }

 private:
  std::map<std::uint64_t, Clock::time_point> granted_;
  std::vector<std::uint64_t> may_land_;
};

// The slots (sequence % slots) a late write of a hole may still land in, at peers still
// connected: a granter skips the sequences that would reuse them. Empty, almost always.
class HeldSlots {
 public:
  template <class Peers>
  HeldSlots(const Peers& peers, std::uint64_t slots) {
    for (const auto& peer : peers) {
      if (!peer.alive) continue;  // its connection is closed here: nothing of it lands any more
      for (const std::uint64_t sequence : peer.outstanding.late_writes_possible()) {
        if (held_.empty()) held_.resize(slots);
        held_[sequence % slots] = true;
      }
    }
  }
  bool holds(std::uint64_t sequence) const noexcept { return !held_.empty() && held_[sequence % held_.size()]; }
  // Every slot is held: nothing can be granted until a worker asks again or is gone.
  bool all() const noexcept {
    return !held_.empty() && std::all_of(held_.begin(), held_.end(), [](bool held) { return held; });
  }

 private:
  std::vector<bool> held_;
};

// Hands every sequence outstanding `hole_timeout` or longer at any of `peers` (each with an
// OutstandingGrants `outstanding`) to on_hole(peer, sequence), in order per peer. Before that
// it calls look_again(): a granter stopped or descheduled between its last look at the input
// and the clock read wakes to find grants "expired" whose writes landed while it slept (the NIC
// takes them), and must take those doorbells first. Returns look_again's work plus one per hole;
// reads no clock while nothing is outstanding (a read costs ~1 us under some VMs).
template <class Peers, class LookAgain, class OnHole>
std::size_t expire_holes(Peers& peers, OutstandingGrants::Clock::duration hole_timeout, LookAgain&& look_again,
                         OnHole&& on_hole) {
  const auto outstanding = [](const auto& peer) { return !peer.outstanding.empty(); };
  if (std::none_of(peers.begin(), peers.end(), outstanding)) return 0;
  const auto now = OutstandingGrants::Clock::now();
  if (std::none_of(peers.begin(), peers.end(),
                   [&](const auto& peer) { return peer.outstanding.any_expired(now, hole_timeout); })) {
    return 0;
  }
  std::size_t work = look_again();
  for (auto& peer : peers) {
    for (const std::uint64_t sequence : peer.outstanding.expire(now, hole_timeout)) {
      on_hole(peer, sequence);
      ++work;
    }
  }
  return work;
}

}  // namespace gradlane::ps
