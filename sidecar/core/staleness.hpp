// Staleness arithmetic (MLfabric's bounded delay), in one place.
//
// Versions. A server's model version is the number of updates it has applied. Updates are
// applied strictly in sequence-number order, and the update with sequence number s moves the
// server from version s-1 to version s (an aggregate is one update: one sequence number, one
// version). So "version" and "last applied sequence number" are the same counter, and the
// scheduler knows the version every update will be applied to the moment it assigns the
// sequence number: granting seq s means "this is applied to version s-1".
//
// Delay. An update computed on version v and applied to version V has
//     delay = V - v - own
// where `own` is the number of parts of the *same request* applied in between (they have
// sequence numbers in (v, V] too, but they are this very gradient, not someone else's update
// the gradient did not see). Without that discount a tensor cut into 25 parts could never meet
// a bound below 24 even on an idle server. An unpartitioned update has own = 0 and this is
// exactly MLfabric's definition: the server version at apply minus the version computed on.
// An update computed on the latest model and applied next has delay 0.
//
// Bound. Every applied update has delay <= tau. With V only growing, an update whose delay
// would already exceed tau if it were applied next can never make it: it is dropped then, and
// never crosses the network. That is the only reason the core drops anything.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "sidecar/core/types.hpp"

namespace gradlane::sched {

inline constexpr Version kNoDeadline = std::numeric_limits<Version>::max();

// Delay of an update computed on `computed_on`, applied to version `applied_to`, with `own`
// parts of the same request applied in between. Precondition: applied_to >= computed_on + own
// (true by construction: both counters only grow and own parts are applied after the pull).
constexpr std::uint64_t delay(Version applied_to, Version computed_on, std::uint64_t own) noexcept {
  return applied_to - computed_on - own;
}

// The latest version an update may still be applied to: computed_on + own + tau.
constexpr Version deadline(Version computed_on, std::uint64_t own, std::optional<std::uint32_t> tau) noexcept {
  if (!tau) return kNoDeadline;
  const Version d = computed_on + own + *tau;
  return d < computed_on ? kNoDeadline : d;  // saturate instead of wrapping
}

// Deadlines reserved by aggregates that were formed but whose server slot is not granted yet.
//
// Why reservations: an aggregate's members are redirected (they cross the network to the
// aggregator) before the aggregate itself gets a sequence number at the server. To keep the
// promise "nothing that crosses the network is later dropped for staleness", the server must
// keep a sequence number free for every pending aggregate by its deadline. Earliest-deadline-
// first over the pending aggregates is feasible iff the k-th earliest deadline D_k satisfies
// V + k - 1 <= D_k (k = 1, 2, ...), where V is the version the next grant is applied to. Any
// other grant uses up one version, so it is allowed only with one version of slack to spare.
class DeadlineReservations {
 public:
  bool empty() const noexcept { return entries_.empty(); }
  std::size_t size() const noexcept { return entries_.size(); }

  // Slack: how many other grants may go before the reservations become tight.
  // Returns max() when there are no reservations.
  std::uint64_t slack(Version next_applied_to) const noexcept {
    std::uint64_t slack = std::numeric_limits<std::uint64_t>::max();
    for (std::size_t k = 0; k < entries_.size(); ++k) {
      const Version must_start_by = entries_[k].first;  // applied to version <= D_k
      const Version position = next_applied_to + k;
      if (position > must_start_by) return 0;
      slack = std::min<std::uint64_t>(slack, must_start_by - position);
    }
    return slack;
  }
  // Whether a grant that is not one of these aggregates may use version `next_applied_to`.
  bool allows_other(Version next_applied_to) const noexcept { return slack(next_applied_to) >= 1; }
  // Whether the aggregate `id` may take version `next_applied_to` now: it is the earliest
  // deadline, or there is slack to serve it out of deadline order.
  bool allows(AggregateId id, Version next_applied_to) const noexcept {
    return earliest(id) || allows_other(next_applied_to);
  }
  // Whether `id` holds the earliest deadline. O(1), unlike slack(): the scheduler's scan pairs
  // it with its cached allows_other() instead of calling allows() per pending aggregate.
  bool earliest(AggregateId id) const noexcept { return !entries_.empty() && entries_.front().second == id; }
  // Whether adding a reservation with deadline `d` keeps every reservation feasible.
  bool feasible_with(Version next_applied_to, Version d) const {
    DeadlineReservations copy = *this;
    copy.insert(d, AggregateId{std::numeric_limits<std::uint64_t>::max()});
    for (std::size_t k = 0; k < copy.entries_.size(); ++k) {
      if (next_applied_to + k > copy.entries_[k].first) return false;
    }
    return true;
  }
  void insert(Version d, AggregateId id) {
    const std::pair<Version, AggregateId> entry{d, id};
    entries_.insert(std::upper_bound(entries_.begin(), entries_.end(), entry), entry);
  }
  void erase(AggregateId id) {
    std::erase_if(entries_, [id](const auto& e) { return e.second == id; });
  }

 private:
  std::vector<std::pair<Version, AggregateId>> entries_;  // sorted by (deadline, id)
};

}  // namespace gradlane::sched
