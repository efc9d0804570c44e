// Scheduler, one decision's first half: which waiting part goes next (the scan over each
// receiver's candidates in SJF/staleness order), and what is dropped as hopeless on the way.
#include "sidecar/core/scheduler.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

namespace gradlane::sched {

Scheduler::Pick Scheduler::scan(Instant now, std::vector<Doomed>& hopeless) {
  wake_.reset();
  for (const Index receiver : candidates_.receivers()) {
    const Version version = hot_[receiver].version;
    for (const auto& [key, sender] : candidates_.waiting(receiver).deadlines) {
      if (key.first >= version) break;  // can never make tau any more: drop
      hopeless.push_back(Doomed{RequestId{key.second}, sender});
    }
  }
  if (!hopeless.empty()) return {};

  const Instant horizon_end = now + config_.grant_horizon;
  ScanBest best;
  for (const Index receiver : candidates_.receivers()) {
    const NicHot& r = hot_[receiver];
    if (!r.can_grant) continue;  // B ahead of the replica: wait for its ack
    const Instant receiver_free = std::max(now, r.ingress_tail);
    const ReceiverQueue& waiting = candidates_.waiting(receiver);
    if (r.plain_ok) scan_index(waiting.parts, receiver, receiver_free, horizon_end, best);
    scan_index(waiting.aggregates, receiver, receiver_free, horizon_end, best);
  }
  if (best.beyond_horizon) wake_ = *best.beyond_horizon - config_.grant_horizon;
  return best.pick;
}

void Scheduler::scan_index(const std::map<OrderKey, std::uint32_t>& index, Index receiver, Instant receiver_free,
                           Instant horizon_end, ScanBest& best) const {
  const bool sjf = config_.ordering == Ordering::mlfabric;
  const auto note_beyond = [&](Instant start) {
    if (!best.beyond_horizon || start < *best.beyond_horizon) best.beyond_horizon = start;
  };
  auto it = index.begin();
  while (it != index.end()) {
    // One rate class at a time (exclusive: the one class 0), each read in decision order.
    const int rate_class = it->first.rate_class;
    const auto class_end = index.lower_bound(OrderKey::after_class(rate_class));
    const Instant class_free = class_start(receiver, rate_class, receiver_free);
    if (class_free > receiver_free && class_free > horizon_end) {
      // Packed, and the line has no room for this class's share within the horizon: wake when
      // it has (perhaps early: a later look reads the class itself).
      note_beyond(class_free);
      it = class_end;
      continue;
    }
    for (; it != class_end; ++it) {
      const Candidate& c = candidates_[it->second];
      // Everything from here on in the class finishes no earlier than class_free + its
      // duration and comes later in the tie-break: once that bound loses to the best, so does
      // the rest of the class.
      if (sjf && best.pick.index != kNone &&
          !better(c, class_free + c.duration, candidate(best.pick.index), best.finish)) {
        break;
      }
      if (!eligible(c)) continue;
      // Pairwise max: std::max({...}) compiles to a loop over an array here.
      const Instant start =
          receiver_start(c, std::max(receiver_free, std::max(c.not_before, hot_[c.sender].egress_tail)));
      if (start > horizon_end) {
        note_beyond(start);
        if (class_free > horizon_end && start == class_free) break;  // nothing in the class starts sooner
        continue;
      }
      const Instant finish = start + c.duration;
      if (best.pick.index == kNone || (sjf && finish < best.finish) ||
          ((!sjf || finish == best.finish) && better(c, finish, candidate(best.pick.index), best.finish))) {
        best.pick = Pick{static_cast<std::int32_t>(it->second), start};
        best.finish = finish;
      }
      if (!sjf) break;  // FIFO: the class is in FIFO order, so the first that can start is its best
    }
    it = class_end;
  }
}

Instant Scheduler::class_start(Index receiver, int rate_class, Instant receiver_free) const {
  if (!packed()) return receiver_free;
  const double receiver_rate = bandwidth_.line_rate(endpoints_[receiver].id, Direction::ingress);
  return endpoints_[receiver].shares.earliest(receiver_free, std::ldexp(1.0, rate_class) / receiver_rate);
}

bool Scheduler::eligible(const Candidate& c) const {
  const NicHot& r = hot_[c.receiver];
  if (!c.aggregate) {
    if (!r.plain_ok) return false;  // the server's next versions are reserved for aggregates
    const NicHot& s = hot_[c.sender];
    return s.in_flight == 0 || s.in_flight + c.length <= config_.credit_bytes;
  }
  // reservations.allows(id, version), with allows_other() read from the hot mirror: the full
  // slack walk per aggregate would make a decision O(aggregates^2).
  return r.plain_ok || endpoints_[c.receiver].reservations.earliest(AggregateId{c.id});
}

Scheduler::Pick Scheduler::scan_all(Instant now, std::vector<Doomed>& hopeless, std::optional<Instant>& wake) const {
  const Instant horizon_end = now + config_.grant_horizon;
  Pick best;
  Instant best_finish{};
  wake.reset();
  for (std::uint32_t i = 0; i < candidates_.size(); ++i) {
    const Candidate& c = candidates_[i];
    const NicHot& r = hot_[c.receiver];
    if (!c.aggregate && r.version > c.deadline) {
      hopeless.push_back(Doomed{RequestId{c.id}, c.sender});
      continue;
    }
    if (!r.can_grant || (!c.aggregate && !r.plain_ok)) continue;  // the indexed scan skips these indices
    // As the indexed scan: a packed rate class with no room within the horizon wakes at the
    // class's bound, eligible or not.
    const Instant receiver_free = std::max(now, r.ingress_tail);
    const Instant class_free = class_start(c.receiver, candidates_.rate_class(c), receiver_free);
    if (class_free > receiver_free && class_free > horizon_end) {
      const Instant w = class_free - config_.grant_horizon;
      if (!wake || w < *wake) wake = w;
      continue;
    }
    if (!eligible(c)) continue;
    const Instant start = receiver_start(c, std::max({now, c.not_before, hot_[c.sender].egress_tail, r.ingress_tail}));
    if (start > horizon_end) {
      const Instant w = start - config_.grant_horizon;
      if (!wake || w < *wake) wake = w;
      continue;
    }
    const Instant finish = start + c.duration;
    if (best.index == kNone || better(c, finish, candidate(best.index), best_finish)) {
      best = Pick{static_cast<std::int32_t>(i), start};
      best_finish = finish;
    }
  }
  return best;
}

void Scheduler::check_scan(Instant now, const Pick& pick, std::vector<Doomed> hopeless) const {
  std::vector<Doomed> all_hopeless;
  std::optional<Instant> all_wake;
  const Pick all = scan_all(now, all_hopeless, all_wake);
  const auto by_request = [](const Doomed& a, const Doomed& b) { return to_int(a.request) < to_int(b.request); };
  std::sort(hopeless.begin(), hopeless.end(), by_request);
  std::sort(all_hopeless.begin(), all_hopeless.end(), by_request);
  const bool same_hopeless =
      std::equal(hopeless.begin(), hopeless.end(), all_hopeless.begin(), all_hopeless.end(),
                 [](const Doomed& a, const Doomed& b) { return a.request == b.request && a.sender == b.sender; });
  if (!same_hopeless)
    throw std::logic_error("gradlane::sched: the indexed scan found other hopeless parts than a full scan");
  if (!hopeless.empty()) return;  // the pick is not used
  if (pick.index != all.index || (pick.index != kNone && pick.start != all.start)) {
    throw std::logic_error("gradlane::sched: the indexed scan picked candidate " + std::to_string(pick.index) +
                           ", a full scan " + std::to_string(all.index));
  }
  if (pick.index == kNone && wake_ != all_wake) {
    throw std::logic_error("gradlane::sched: the indexed scan's wakeup differs from a full scan's");
  }
}

bool Scheduler::better(const Candidate& c, Instant finish, const Candidate& best, Instant best_finish) const {
  // Aggregates before parts on a full tie: they carry several updates' worth of progress.
  const int c_kind = c.aggregate ? 0 : 1;
  const int b_kind = best.aggregate ? 0 : 1;
  if (config_.ordering == Ordering::fifo) {
    return std::tuple(c_kind, c.id, c.part) < std::tuple(b_kind, best.id, best.part);
  }
  return std::tuple(finish, -c.norm, c_kind, c.id, c.part) <
         std::tuple(best_finish, -best.norm, b_kind, best.id, best.part);
}

void Scheduler::drop(std::vector<Doomed> doomed, std::vector<Outcome>& out) {
  std::sort(doomed.begin(), doomed.end(),
            [](const Doomed& a, const Doomed& b) { return to_int(a.request) < to_int(b.request); });

  for (const Doomed& d : doomed) {
    const auto it = requests_.find(d.request);
    RequestState& q = it->second;
    EndpointState& s = endpoints_[d.sender];
    const Version applied_to = endpoints_[q.receiver].window.granted();
    const std::uint64_t would_be = delay(applied_to, q.request.computed_on, q.parts_sequenced);
    // The request's later parts are just as hopeless (same version, same own count, and the
    // server version only grows): drop them now so the sender hears it once.
    for (const QueuedPart& p : s.queue.remove_request(q.request.job, q.request.id)) {
      out.emplace_back(Drop{q.request.id, p.index, p.count, p.offset, p.length, q.request.job, q.request.sender,
                            q.request.receiver, DropReason::staleness_bound, would_be});
      ++stats_.drops;
      ++stats_.decisions;
      --pending_parts_;
      --q.parts_open;
    }
    assert(q.parts_open == 0);
    requests_.erase(it);
    remove_candidate(s.head);
    s.head = kNone;
    refresh_head(d.sender);
  }
}

}  // namespace gradlane::sched
