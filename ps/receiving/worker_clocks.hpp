// WorkerClocks: stale-synchronous parallel's clocks (Ho et al.), kept where updates are applied.
// A worker's clock is the steps it completed: the tag of its latest applied update + 1, when it
// tags each push with its step (gradlane_train does). The shard publishes the slowest clock of
// workers 1..N in its header (ShardOptions::clock_workers); a worker about to start step k
// under bound s waits while k > slowest + s (Worker::slowest_clock()).
//
// Tags come from peers, so nothing here trusts them: an id outside 1..N is not one of the clocked
// workers (an aggregator's forward, a misconfigured worker) and is ignored, a tag of 2^64 − 1
// saturates, and a clock never goes back (an update applied late, a worker restarted from an
// older step).
//
// Pure. Not thread-safe; one owner (the apply loop).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace gradlane::ps {

class WorkerClocks {
 public:
  explicit WorkerClocks(std::uint32_t workers) : clocks_(workers, 0) {}

  // The update tagged `tag` of `worker` was applied. True if the slowest clock moved.
  bool applied(std::uint32_t worker, std::uint64_t tag) {
    if (worker == 0 || worker > clocks_.size()) return false;
    const std::uint64_t clock = tag == std::numeric_limits<std::uint64_t>::max() ? tag : tag + 1;
    std::uint64_t& mine = clocks_[worker - 1];
    if (clock <= mine) return false;
    const bool was_slowest = mine == slowest_;
    mine = clock;
    if (!was_slowest) return false;
    const std::uint64_t before = slowest_;
    slowest_ = *std::min_element(clocks_.begin(), clocks_.end());
    return slowest_ != before;
  }
  // The smallest clock of workers 1..N (0 until each has had an update applied).
  std::uint64_t slowest() const { return slowest_; }
  std::uint64_t of(std::uint32_t worker) const {
    return worker == 0 || worker > clocks_.size() ? 0 : clocks_[worker - 1];
  }

 private:
  std::vector<std::uint64_t> clocks_;  // worker w's at w − 1
  std::uint64_t slowest_ = 0;
};

}  // namespace gradlane::ps
