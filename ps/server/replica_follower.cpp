// ReplicaFollower (replica_follower.hpp).
#include "ps/server/replica_follower.hpp"

#include <algorithm>

namespace gradlane::ps {

bool ReplicaFollower::mirror_coming(const Decided& decision, bool workers_mirror) const {
  if (stopped_.contains(decision.worker)) return false;
  if (!joined_running_) return workers_mirror;
  const auto from = mirrors_from_.find(decision.worker);
  return from != mirrors_from_.end() && decision.sequence >= from->second;
}

std::size_t ReplicaFollower::feed(ApplyOrder& order, Clock::time_point now, Clock::duration patience,
                                  bool workers_mirror, bool can_fetch, const Fetch& fetch) {
  std::size_t fed = 0;
  for (;;) {
    const std::uint64_t head = order.next_sequence();
    if (order.next()) break;  // already fed, waiting to be applied
    const auto decision = decisions_.find(head);
    if (decision == decisions_.end()) break;
    const auto slot = static_cast<std::uint32_t>(head % order.slot_count());
    if (decision->second.worker == 0) {
      order.cancelled(head);
    } else if (mirrored_.contains(head)) {
      order.arrived(head, slot);
    } else {
      if (!head_waiting_since_) head_waiting_since_ = now;
      const auto wait = mirror_coming(decision->second, workers_mirror) ? patience : Clock::duration::zero();
      if (now - *head_waiting_since_ < wait || !can_fetch) break;
      fetch(head);
      order.arrived(head, slot);
    }
    head_waiting_since_.reset();
    fed_[head] = decision->second;
    decisions_.erase(decision);
    mirrored_.erase(head);
    ++fed;
  }
  return fed;
}

std::optional<Decided> ReplicaFollower::take_fed(std::uint64_t sequence) {
  auto decided = fed_.extract(sequence);
  if (decided.empty()) return std::nullopt;
  return decided.mapped();
}

std::uint64_t ReplicaFollower::take_over(ApplyOrder& order, const EarlierTag& earlier_tag) {
  const std::uint64_t slots = order.slot_count();
  std::uint64_t lost = 0;
  for (std::uint64_t head = order.next_sequence(); decisions_.contains(head); ++head) {
    const Decided& decision = decisions_.at(head);
    const bool apply = decision.worker != 0;
    if (apply && mirrored_.contains(head)) {
      order.arrived(head, static_cast<std::uint32_t>(head % slots));
      fed_[head] = decision;
    } else {
      order.cancelled(head);
      lost += apply ? 1 : 0;
    }
  }
  const auto next_tag = [&](std::uint32_t worker) -> std::uint64_t {
    for (auto it = fed_.rbegin(); it != fed_.rend(); ++it) {
      if (it->second.worker == worker) return it->second.tag + 1;
    }
    const std::optional<std::uint64_t> earlier = earlier_tag(worker);
    return earlier ? *earlier + 1 : 0;
  };
  const auto take_mirror = [&](std::uint64_t sequence) {
    const Mirror& mirror = mirrored_.at(sequence);
    const std::uint32_t worker = std::max<std::uint32_t>(mirror.worker, 1);
    order.arrived(sequence, static_cast<std::uint32_t>(sequence % slots));
    fed_[sequence] = Decided{sequence, worker, mirror.tag ? *mirror.tag : next_tag(worker)};
  };
  std::uint64_t head = order.next_sequence() + order.pending();
  for (; mirrored_.contains(head) && !decisions_.contains(head); ++head) take_mirror(head);
  // Mirrors after a gap, the gaps skipped: acknowledged pushes whose workers' writes to the
  // server completed (the kill:server fault: two lost behind one gap).
  if (!mirrored_.empty()) {
    const std::uint64_t last = mirrored_.rbegin()->first;
    for (; head <= last && head < order.next_sequence() + slots; ++head) {
      if (mirrored_.contains(head)) {
        take_mirror(head);
      } else {
        order.cancelled(head);
      }
    }
  }
  for (const auto& [sequence, mirror] : mirrored_) lost += sequence >= head ? 1 : 0;
  decisions_.clear();
  mirrored_.clear();
  head_waiting_since_.reset();
  return lost;
}

std::optional<std::uint64_t> ReplicaFollower::ack_due(std::uint64_t applied_through) {
  if (applied_through <= acked_) return std::nullopt;
  acked_ = applied_through;
  return acked_;
}

}  // namespace gradlane::ps
