// OutstandingGrants: the sequences granted to one worker whose doorbell has not come yet, as a
// direct-mode granter keeps them (the shard server for its workers, the aggregator for its
// members). A doorbell counts only from the worker a sequence was granted to, and only once; a
// worker that dies, or stays silent past the hole timeout, gives its sequences back as holes
// for the apply order to skip.
//
// Pure: the time is an argument. Not thread-safe; one owner (the granter's poll loop).
#pragma once

#include <chrono>
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

 private:
  std::map<std::uint64_t, Clock::time_point> granted_;
};

}  // namespace gradlane::ps
