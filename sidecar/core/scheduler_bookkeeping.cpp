// Scheduler's bookkeeping: each sender's head part, the candidate table and its order index,
// and the records of granted transfers.
#include "sidecar/core/scheduler.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <tuple>

namespace gradlane::sched {

void Scheduler::refresh_head(Index sender) {
  EndpointState& s = endpoints_[sender];
  const std::optional<TenantArbiter::Head> head = s.queue.head();
  if (!head) {
    if (s.head != kNone) remove_candidate(s.head);
    s.head = kNone;
    return;
  }
  if (s.head != kNone) {
    const Candidate& cur = candidates_[static_cast<std::size_t>(s.head)];
    if (cur.id == to_int(head->part.request) && cur.part == head->part.index) return;
    const auto at = static_cast<std::uint32_t>(s.head);
    unindex_candidate(at);
    candidates_[at] = part_candidate(sender, head->job, head->part);
    index_candidate(at);
    return;
  }
  s.head = add_candidate(part_candidate(sender, head->job, head->part));
}

Scheduler::Candidate Scheduler::part_candidate(Index sender, JobId job, const QueuedPart& part) const {
  const RequestState& q = requests_.at(part.request);
  Candidate c;
  c.duration = path_time(sender, q.receiver, part.length);
  c.deadline = deadline(q.request.computed_on, q.parts_sequenced, config_.staleness_bound);
  c.sender = sender;
  c.receiver = q.receiver;
  c.length = part.length;
  // An app's NaN would leave the decision order without a total order.
  c.norm = std::isnan(q.request.gradient_norm) ? 0.0 : q.request.gradient_norm;
  c.id = to_int(part.request);
  c.part = part.index;
  c.job = job;
  c.tensor = q.request.tensor;
  c.offset = part.offset;
  c.direct_only = q.request.direct_only;
  return c;
}

void Scheduler::sync_receiver(Index endpoint) {
  const EndpointState& e = endpoints_[endpoint];
  NicHot& h = hot_[endpoint];
  h.ingress_tail = packed() ? e.shares.floor() : e.ingress.tail();
  h.version = e.window.granted();
  h.can_grant = e.window.can_grant();
  h.plain_ok = e.reservations.allows_other(h.version);
}

void Scheduler::refresh_durations() {
  for (std::uint32_t i = 0; i < candidates_.size(); ++i) {
    const Candidate& c = candidates_[i];
    const Nanos duration = path_time(c.sender, c.receiver, c.length);
    if (duration == c.duration) continue;
    unindex_candidate(i);
    candidates_[i].duration = duration;
    index_candidate(i);
  }
  bandwidth_generation_ = bandwidth_.generation();
}

std::int32_t Scheduler::add_candidate(const Candidate& c) {
  candidates_.push_back(c);
  index_candidate(static_cast<std::uint32_t>(candidates_.size() - 1));
  return static_cast<std::int32_t>(candidates_.size() - 1);
}

void Scheduler::remove_candidate(std::int32_t index) {
  // Swap-remove: O(1) in the array; the receiver index of the moved one is re-pointed.
  const auto i = static_cast<std::uint32_t>(index);
  const auto last = static_cast<std::uint32_t>(candidates_.size() - 1);
  unindex_candidate(i);
  if (i != last) {
    candidates_[i] = candidates_[last];
    const Candidate& moved = candidates_[i];
    ReceiverQueue& waiting = endpoints_[moved.receiver].waiting;
    (moved.aggregate ? waiting.aggregates : waiting.parts).at(order_key(moved)) = i;
    if (moved.aggregate) {
      aggregates_.at(AggregateId{moved.id}).candidate = index;
    } else {
      endpoints_[moved.sender].head = index;
    }
  }
  candidates_.pop_back();
}

Scheduler::OrderKey Scheduler::order_key(const Candidate& c) const {
  if (config_.ordering == Ordering::fifo) return OrderKey{rate_class(c), Nanos{0}, 0.0, c.id, c.part};
  return OrderKey{rate_class(c), c.duration, -c.norm, c.id, c.part};
}

void Scheduler::index_candidate(std::uint32_t index) {
  const Candidate& c = candidates_[index];
  ReceiverQueue& waiting = endpoints_[c.receiver].waiting;
  if (waiting.empty()) receivers_waited_for_.insert(c.receiver);
  [[maybe_unused]] const bool added =
      (c.aggregate ? waiting.aggregates : waiting.parts).emplace(order_key(c), index).second;
  assert(added);
  if (!c.aggregate) waiting.deadlines.emplace(std::pair(c.deadline, c.id), c.sender);
}

void Scheduler::unindex_candidate(std::uint32_t index) {
  const Candidate& c = candidates_[index];
  ReceiverQueue& waiting = endpoints_[c.receiver].waiting;
  [[maybe_unused]] const std::size_t erased = (c.aggregate ? waiting.aggregates : waiting.parts).erase(order_key(c));
  assert(erased == 1);
  if (!c.aggregate) waiting.deadlines.erase(std::pair(c.deadline, c.id));
  if (waiting.empty()) receivers_waited_for_.erase(c.receiver);
}

TransferId Scheduler::record_transfer(Index sender, Index receiver, Bytes bytes, Slot slot, bool credit, Seq seq,
                                      JobId job) {
  const TransferId id{next_transfer_++};
  transfers_.emplace(id, TransferRecord{sender, receiver, bytes, slot, credit, seq, job});
  return id;
}

void Scheduler::finish_request_part(RequestState& request, bool sequenced) {
  --pending_parts_;
  --request.parts_open;
  if (sequenced) ++request.parts_sequenced;
  if (request.parts_open == 0) {
    const RequestId id = request.request.id;  // erase(key) must not read the dying element
    requests_.erase(id);
  }
}

}  // namespace gradlane::sched
