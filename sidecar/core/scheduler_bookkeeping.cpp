// Scheduler's bookkeeping: each sender's head part and the candidates' owners (the table and
// its order index are CandidateTable's), and the records of granted transfers.
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
    const Candidate& cur = candidate(s.head);
    if (cur.id == to_int(head->part.request) && cur.part == head->part.index) return;
    candidates_.replace(static_cast<std::uint32_t>(s.head), part_candidate(sender, head->job, head->part));
    return;
  }
  s.head = add_candidate(part_candidate(sender, head->job, head->part));
}

Candidate Scheduler::part_candidate(Index sender, JobId job, const QueuedPart& part) const {
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
    if (duration != c.duration) candidates_.set_duration(i, duration);
  }
  bandwidth_generation_ = bandwidth_.generation();
}

void Scheduler::remove_candidate(std::int32_t index) {
  const Candidate* moved = candidates_.remove(static_cast<std::uint32_t>(index));
  if (moved == nullptr) return;
  if (moved->aggregate) {
    aggregates_.at(AggregateId{moved->id}).candidate = index;
  } else {
    endpoints_[moved->sender].head = index;
  }
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
