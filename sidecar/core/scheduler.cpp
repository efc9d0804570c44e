#include "sidecar/core/scheduler.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

#include "sidecar/core/aggregation.hpp"

namespace gradlane::sched {
namespace {

SchedulerConfig checked(SchedulerConfig config) {
  if (auto problem = config.validate()) {
    throw std::invalid_argument("gradlane::sched::SchedulerConfig: " + *problem);
  }
  return config;
}

}  // namespace

Scheduler::Scheduler(SchedulerConfig config)
    : config_(checked(config)),
      partitioner_(config_.partition_bytes, config_.partition_align),
      bandwidth_(config_.bandwidth),
      bandwidth_generation_(bandwidth_.generation()) {
  for (const AggregationConfig::Seat& seat : config_.aggregation.aggregators) add_aggregator(seat.job, seat.endpoint);
  for (const BandwidthConfig::Declared& d : config_.bandwidth.declared)
    set_rate(d.endpoint, d.direction, d.bytes_per_sec);
}

// ---------------------------------------------------------------------------------------------
// Endpoints

Scheduler::Index Scheduler::endpoint(EndpointId id) {
  const auto [it, inserted] = index_.try_emplace(id, static_cast<Index>(endpoints_.size()));
  if (inserted) {
    EndpointState e;
    e.id = id;
    e.queue = config_.job_sharing == JobSharing::shortest_remaining
                  ? TenantArbiter(config_.tenant_floor_share, config_.partition_bytes)
                  : TenantArbiter(config_.job_sharing, config_.job_priority);
    e.window = ReplicationWindow(config_.replica_bound);
    endpoints_.push_back(std::move(e));
    hot_.emplace_back();
  }
  return it->second;
}

const Scheduler::EndpointState* Scheduler::find(EndpointId id) const {
  const auto it = index_.find(id);
  return it == index_.end() ? nullptr : &endpoints_[it->second];
}

double Scheduler::share(const Candidate& c) const {
  if (!packed()) return 1.0;
  const double seconds = std::chrono::duration<double>(c.duration).count();
  if (!(seconds > 0.0)) return 1.0;
  const double receiver_rate = bandwidth_.rate(endpoints_[c.receiver].id, Direction::ingress);
  return IngressShares::clamp(static_cast<double>(c.length) / seconds / receiver_rate);
}

Instant Scheduler::receiver_start(const Candidate& c, Instant start) const {
  return packed() ? endpoints_[c.receiver].shares.earliest(start, share(c)) : start;
}

Slot Scheduler::book_receiver(Index receiver, const Candidate& c, Instant start, Instant now) {
  EndpointState& r = endpoints_[receiver];
  if (!packed()) {
    r.ingress.retire_before(now);
    return r.ingress.grant(start, c.duration);
  }
  r.shares.retire_before(now);
  const Slot slot{start, start + std::max(c.duration, Nanos::zero())};
  [[maybe_unused]] const bool booked = r.shares.book(slot, share(c));
  assert(booked);
  return slot;
}

Nanos Scheduler::path_time(Index sender, Index receiver, Bytes bytes) const {
  return bandwidth_.transfer_time(endpoints_[sender].id, endpoints_[receiver].id, bytes, sender_copies(receiver));
}

unsigned Scheduler::sender_copies(Index receiver) const {
  const EndpointState& r = endpoints_[receiver];
  return config_.writers_mirror && config_.replica_bound && !r.aggregates ? 2 : 1;
}

// The window a (re)opened receiver gets: B, narrowed to its server's slots.
static ReplicationWindow window_for(const std::optional<std::uint64_t>& replica_bound,
                                    const std::optional<std::uint64_t>& slot_limit, Seq start) {
  ReplicationWindow w(replica_bound, start);
  if (slot_limit) w.limit(*slot_limit);
  return w;
}

void Scheduler::limit_window(EndpointId receiver, std::uint64_t slots) {
  if (slots == 0) return;
  const Index i = endpoint(receiver);
  EndpointState& r = endpoints_[i];
  r.slot_limit = r.slot_limit ? std::min(*r.slot_limit, slots) : slots;
  r.window.limit(*r.slot_limit);
  sync_receiver(i);
}

void Scheduler::set_rate(EndpointId endpoint_id, Direction direction, double bytes_per_sec) {
  endpoint(endpoint_id);
  bandwidth_.set_rate(endpoint_id, direction, bytes_per_sec);
}

void Scheduler::hold_receiver(EndpointId receiver) {
  const Index i = endpoint(receiver);
  EndpointState& r = endpoints_[i];
  r.held = true;
  r.window.limit(0);  // a window of 0: can_grant() is false until open_receiver() makes a new one
  sync_receiver(i);
}

void Scheduler::serve_job(EndpointId receiver, std::optional<JobId> job) {
  endpoints_[endpoint(receiver)].serves = job;
}

bool Scheduler::open_receiver(EndpointId receiver, Version current) {
  EndpointState& r = endpoints_[endpoint(receiver)];
  if (r.sequenced || !r.reservations.empty()) return false;
  r.held = false;
  r.window = window_for(config_.replica_bound, r.slot_limit, current);
  sync_receiver(index_.at(receiver));
  return true;
}

std::size_t Scheduler::close_receiver(EndpointId receiver_id, std::vector<Outcome>& out) {
  const auto found = index_.find(receiver_id);
  if (found == index_.end()) return 0;
  const Index receiver = found->second;
  // Parts: every request addressed to it, in id order (a deterministic order of drops).
  std::vector<RequestId> doomed;
  for (const auto& [id, q] : requests_) {
    if (q.receiver == receiver) doomed.push_back(id);
  }
  std::sort(doomed.begin(), doomed.end(), [](RequestId a, RequestId b) { return to_int(a) < to_int(b); });
  for (const RequestId id : doomed) {
    RequestState& q = requests_.at(id);
    EndpointState& s = endpoints_[q.sender];
    for (const QueuedPart& p : s.queue.remove_request(q.request.job, q.request.id)) {
      out.emplace_back(Drop{q.request.id, p.index, p.count, p.offset, p.length, q.request.job, q.request.sender,
                            q.request.receiver, DropReason::receiver_moved, 0});
      ++stats_.drops;
      ++stats_.decisions;
      --pending_parts_;
      --q.parts_open;
    }
    const Index sender = q.sender;
    // Parts granted before stay open until their completion; a request with none is done.
    if (q.parts_open == 0) requests_.erase(id);
    if (s.head != kNone) {
      remove_candidate(s.head);
      s.head = kNone;
    }
    refresh_head(sender);
  }
  // Aggregates that would have taken one of its sequences.
  std::size_t forgotten = 0;
  for (auto it = aggregates_.begin(); it != aggregates_.end();) {
    if (it->second.receiver != receiver) {
      ++it;
      continue;
    }
    if (it->second.candidate != kNone) remove_candidate(it->second.candidate);
    it = aggregates_.erase(it);
    ++forgotten;
  }
  // Its sequences in flight are the old server's: a failure must not cancel one at the new.
  for (auto& [transfer, record] : transfers_) {
    if (record.receiver == receiver) record.seq = 0;
  }
  cancels_.erase(
      std::remove_if(cancels_.begin(), cancels_.end(), [&](const Cancel& c) { return c.receiver == receiver_id; }),
      cancels_.end());
  EndpointState& r = endpoints_[receiver];
  r.reservations = DeadlineReservations{};
  r.sequenced = false;
  r.window = window_for(config_.replica_bound, r.slot_limit, r.window.granted());
  if (r.held) r.window.limit(0);
  sync_receiver(receiver);
  return forgotten;
}

void Scheduler::add_aggregator(JobId job, EndpointId endpoint_id) {
  const Index i = endpoint(endpoint_id);
  endpoints_[i].aggregates = true;
  auto& list = aggregators_[job];
  const auto at = std::lower_bound(list.begin(), list.end(), i);
  if (at == list.end() || *at != i) list.insert(at, i);
}

void Scheduler::remove_aggregator(JobId job, EndpointId endpoint_id) {
  const auto e = index_.find(endpoint_id);
  const auto j = aggregators_.find(job);
  if (e == index_.end() || j == aggregators_.end()) return;
  std::erase(j->second, e->second);
}

// ---------------------------------------------------------------------------------------------
// Inputs

SubmitStatus Scheduler::submit(const Request& request, Instant now) {
  last_now_ = std::max(last_now_, now);
  if (request.bytes == 0) return SubmitStatus::empty_request;
  if (request.sender == request.receiver) return SubmitStatus::sender_is_receiver;
  if (requests_.contains(request.id)) return SubmitStatus::duplicate_id;
  const Index sender = endpoint(request.sender);
  const Index receiver = endpoint(request.receiver);
  if (endpoints_[receiver].serves && *endpoints_[receiver].serves != request.job) {
    return SubmitStatus::receiver_of_another_job;
  }
  // A held receiver's sequence is its surviving server's, not known here until it takes it over
  // (slots past any version it served): its requests wait for that.
  if (!endpoints_[receiver].held && request.computed_on > endpoints_[receiver].window.granted()) {
    return SubmitStatus::version_from_future;
  }

  const std::uint32_t parts = partitioner_.count(request.bytes);
  requests_.emplace(request.id, RequestState{request, sender, receiver, parts, 0});
  endpoints_[sender].queue.push_parts(request.job,
                                      QueuedRun{request.priority, request.id, 0, parts, parts, 0,
                                                partitioner_.part(request.bytes, 0).length, request.bytes},
                                      request.job_remaining);
  pending_parts_ += parts;
  ++stats_.requests;
  stats_.parts += parts;
  // A new part may preempt the current head (higher priority, or a shorter job): re-ask.
  refresh_head(sender);
  return SubmitStatus::accepted;
}

std::vector<Outcome> Scheduler::schedule(Instant now) {
  std::vector<Outcome> out;
  schedule(now, out);
  return out;
}

void Scheduler::schedule(Instant now, std::vector<Outcome>& out) {
  now = std::max(now, last_now_);
  last_now_ = now;
  for (const Cancel& c : cancels_) out.emplace_back(c);
  cancels_.clear();
  if (bandwidth_.generation() != bandwidth_generation_) refresh_durations();

  std::vector<Doomed>& hopeless = scratch_hopeless_;
  for (;;) {
    hopeless.clear();
    const Pick pick = scan(now, hopeless);
    if (config_.check_scan) check_scan(now, pick, hopeless);
    if (!hopeless.empty()) {
      // Drops change heads (and so candidates): decide them first, then look again.
      drop(hopeless, out);
      continue;
    }
    if (pick.index == kNone) break;
    if (candidates_[static_cast<std::size_t>(pick.index)].aggregate) {
      grant_aggregate(pick, now, out);
    } else {
      grant_part(pick, now, out);
    }
  }
}

bool Scheduler::complete(TransferId transfer, Instant now, Nanos measured, TransferResult result) {
  const auto it = transfers_.find(transfer);
  if (it == transfers_.end()) return false;
  last_now_ = std::max(last_now_, now);
  const TransferRecord rec = it->second;
  transfers_.erase(it);
  EndpointState& s = endpoints_[rec.sender];
  if (rec.counts_credit) hot_[rec.sender].in_flight -= rec.bytes;
  if (result == TransferResult::ok) {
    bandwidth_.observe_transfer(s.id, endpoints_[rec.receiver].id, rec.bytes, measured, sender_copies(rec.receiver));
  } else if (rec.seq != 0) {
    cancels_.push_back(Cancel{transfer, rec.job, endpoints_[rec.receiver].id, rec.seq});
  }
  // Finished early: hand the rest of the slot back if nothing was booked after it. Only what
  // used_slot() says was used: a failed transfer keeps its whole slot, since its bytes may
  // still be arriving, and a later grant must not be booked on top of them.
  const Instant used_end = used_slot(rec.slot, now, result).end;
  s.egress.finish(rec.slot, used_end);
  sync_egress(rec.sender);
  endpoints_[rec.receiver].ingress.finish(rec.slot, used_end);
  endpoints_[rec.receiver].shares.finish(rec.slot, used_end);
  sync_receiver(rec.receiver);
  return true;
}

std::optional<TransferView> Scheduler::transfer(TransferId transfer) const {
  const auto it = transfers_.find(transfer);
  if (it == transfers_.end()) return std::nullopt;
  const TransferRecord& r = it->second;
  return TransferView{endpoints_[r.sender].id, endpoints_[r.receiver].id, r.bytes, r.slot, r.seq, r.job};
}

bool Scheduler::replica_ack(EndpointId receiver, Seq seq) {
  const auto it = index_.find(receiver);
  if (it == index_.end()) return false;
  const bool ok = endpoints_[it->second].window.ack(seq);
  sync_receiver(it->second);
  return ok;
}

void Scheduler::observe_transfer(EndpointId sender, EndpointId receiver, Bytes bytes, Nanos duration) {
  bandwidth_.observe_transfer(sender, receiver, bytes, duration);
}

// ---------------------------------------------------------------------------------------------
// Inspection

Version Scheduler::server_version(EndpointId receiver) const {
  const EndpointState* r = find(receiver);
  return r ? r->window.granted() : 0;
}

std::optional<JobId> Scheduler::served_job(EndpointId receiver) const {
  const EndpointState* r = find(receiver);
  return r ? r->serves : std::nullopt;
}

Seq Scheduler::replica_acked(EndpointId receiver) const {
  const EndpointState* r = find(receiver);
  return r ? r->window.acked() : 0;
}

Bytes Scheduler::in_flight(EndpointId endpoint_id) const {
  const auto it = index_.find(endpoint_id);
  return it == index_.end() ? 0 : hot_[it->second].in_flight;
}

const SlotBook* Scheduler::ingress(EndpointId endpoint_id) const {
  const EndpointState* e = find(endpoint_id);
  return e ? &e->ingress : nullptr;
}

const IngressShares* Scheduler::ingress_shares(EndpointId endpoint_id) const {
  const EndpointState* e = find(endpoint_id);
  return e ? &e->shares : nullptr;
}

const SlotBook* Scheduler::egress(EndpointId endpoint_id) const {
  const EndpointState* e = find(endpoint_id);
  return e ? &e->egress : nullptr;
}

// ---------------------------------------------------------------------------------------------
// One decision

Scheduler::Pick Scheduler::scan(Instant now, std::vector<Doomed>& hopeless) {
  wake_.reset();
  for (const Index receiver : receivers_waited_for_) {
    const Version version = hot_[receiver].version;
    for (const auto& [key, sender] : endpoints_[receiver].waiting.deadlines) {
      if (key.first >= version) break;  // can never make tau any more: drop
      hopeless.push_back(Doomed{RequestId{key.second}, sender});
    }
  }
  if (!hopeless.empty()) return {};

  const Instant horizon_end = now + config_.grant_horizon;
  ScanBest best;
  for (const Index receiver : receivers_waited_for_) {
    const NicHot& r = hot_[receiver];
    if (!r.can_grant) continue;  // B ahead of the replica: wait for its ack
    const Instant receiver_free = std::max(now, r.ingress_tail);
    const ReceiverQueue& waiting = endpoints_[receiver].waiting;
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
    const auto class_end = index.lower_bound(OrderKey{rate_class + 1, Nanos::min(), 0.0, 0, 0});
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
          !better(c, class_free + c.duration, candidates_[static_cast<std::size_t>(best.pick.index)], best.finish)) {
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
          ((!sjf || finish == best.finish) &&
           better(c, finish, candidates_[static_cast<std::size_t>(best.pick.index)], best.finish))) {
        best.pick = Pick{static_cast<std::int32_t>(it->second), start};
        best.finish = finish;
      }
      if (!sjf) break;  // FIFO: the class is in FIFO order, so the first that can start is its best
    }
    it = class_end;
  }
}

int Scheduler::rate_class(const Candidate& c) const {
  if (!packed()) return 0;
  const double seconds = std::chrono::duration<double>(c.duration).count();
  if (!(seconds > 0.0)) return kRateClasses - 1;
  const double rate = static_cast<double>(c.length) / seconds;
  if (!(rate >= 1.0)) return 0;
  return std::min(std::ilogb(rate), kRateClasses - 1);  // 2^class <= rate < 2^(class + 1)
}

Instant Scheduler::class_start(Index receiver, int rate_class, Instant receiver_free) const {
  if (!packed()) return receiver_free;
  const double receiver_rate = bandwidth_.rate(endpoints_[receiver].id, Direction::ingress);
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
    const Instant class_free = class_start(c.receiver, rate_class(c), receiver_free);
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
    if (best.index == kNone || better(c, finish, candidates_[static_cast<std::size_t>(best.index)], best_finish)) {
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

void Scheduler::grant_part(const Pick& pick, Instant now, std::vector<Outcome>& out) {
  const Candidate c = candidates_[static_cast<std::size_t>(pick.index)];
  // The pick and those that would wait behind it, summed off-server, if that beats sending it.
  if (config_.aggregation.pick_joins && try_aggregate(c, now, out, /*pick_joins=*/true)) return;
  EndpointState& s = endpoints_[c.sender];
  EndpointState& r = endpoints_[c.receiver];
  RequestState& q = requests_.at(RequestId{c.id});

  const QueuedPart part = s.queue.pop(c.job);
  assert(part.request == q.request.id && part.index == c.part);
  s.queue.served(c.job, part.length);

  const Version applied_to = r.window.granted();
  const Seq seq = r.window.grant();
  r.sequenced = true;
  const std::uint64_t d = delay(applied_to, q.request.computed_on, q.parts_sequenced);

  s.egress.retire_before(now);
  const Slot slot = book_receiver(c.receiver, c, pick.start, now);
  [[maybe_unused]] const bool booked = s.egress.reserve(slot);
  assert(booked && slot.start == pick.start);
  sync_egress(c.sender);
  hot_[c.sender].in_flight += part.length;

  out.emplace_back(Grant{record_transfer(c.sender, c.receiver, part.length, slot, true, seq, q.request.job),
                         q.request.id, part.index, part.count, part.offset, part.length, q.request.job,
                         q.request.tensor, q.request.sender, q.request.receiver, slot, seq, d});
  ++stats_.grants;
  ++stats_.decisions;
  finish_request_part(q, /*sequenced=*/true);  // may erase q

  remove_candidate(pick.index);
  s.head = kNone;
  refresh_head(c.sender);
  sync_receiver(c.receiver);
  try_aggregate(c, now, out, /*pick_joins=*/false);
}

void Scheduler::grant_aggregate(const Pick& pick, Instant now, std::vector<Outcome>& out) {
  const Candidate c = candidates_[static_cast<std::size_t>(pick.index)];
  const AggregateId id{c.id};
  const auto it = aggregates_.find(id);
  PendingAggregate& g = it->second;
  EndpointState& a = endpoints_[g.aggregator];
  EndpointState& r = endpoints_[g.receiver];

  const Version applied_to = r.window.granted();
  const Seq seq = r.window.grant();
  r.sequenced = true;

  a.egress.retire_before(now);
  const Slot slot = book_receiver(g.receiver, c, pick.start, now);
  [[maybe_unused]] const bool booked = a.egress.reserve(slot);
  assert(booked);
  sync_egress(g.aggregator);

  // The aggregate is one of each member request's own parts (staleness.hpp): members that
  // still have parts queued get one more version of allowance.
  for (const PartRef& m : g.members) {
    const auto q = requests_.find(m.request);
    if (q == requests_.end()) continue;
    ++q->second.parts_sequenced;
    EndpointState& sender = endpoints_[q->second.sender];
    if (sender.head != kNone) {
      Candidate& h = candidates_[static_cast<std::size_t>(sender.head)];
      if (h.id == to_int(m.request)) {
        unindex_candidate(static_cast<std::uint32_t>(sender.head));
        h.deadline = deadline(q->second.request.computed_on, q->second.parts_sequenced, config_.staleness_bound);
        index_candidate(static_cast<std::uint32_t>(sender.head));
      }
    }
  }

  out.emplace_back(AggregateGrant{record_transfer(g.aggregator, g.receiver, g.length, slot, false, seq, g.job), id,
                                  g.job, g.tensor, g.offset, g.length, a.id, r.id, std::move(g.members), slot, seq,
                                  applied_to - g.base});
  ++stats_.aggregates;
  ++stats_.decisions;

  const Index receiver = g.receiver;
  r.reservations.erase(id);
  aggregates_.erase(it);
  remove_candidate(pick.index);
  sync_receiver(receiver);
}

bool Scheduler::try_aggregate(const Candidate& granted, Instant now, std::vector<Outcome>& out, bool pick_joins) {
  if (!config_.aggregation.enabled || config_.ordering != Ordering::mlfabric) return false;
  const auto job_aggregators = aggregators_.find(granted.job);
  if (job_aggregators == aggregators_.end() || job_aggregators->second.empty()) return false;

  const Index receiver = granted.receiver;
  // After a grant, the others wait behind it. For the pick itself (not granted yet), they and it
  // are measured against the server as it would be after the pick: those that would then wait,
  // the pick among them, may form the group.
  // Packed, they wait until a share like the granted one is free again, and the pick (which
  // starts once its share is free) never has anyone behind it.
  if (pick_joins && packed()) return false;
  const Instant server_free = packed()     ? endpoints_[receiver].shares.earliest(now, share(granted))
                              : pick_joins ? std::max(now, endpoints_[receiver].ingress.tail())
                                           : endpoints_[receiver].ingress.tail();
  const Instant wait_behind = pick_joins ? server_free + granted.duration : server_free;
  const Version next_applied_to = endpoints_[receiver].window.granted();
  const Bytes credit = config_.credit_bytes;

  // Candidates for the same slice of the same tensor that would now queue behind the server.
  std::vector<GroupCandidate> waiting;
  for (const Candidate& m : candidates_) {
    if (m.aggregate || m.direct_only || m.receiver != receiver || m.job != granted.job || m.tensor != granted.tensor ||
        m.offset != granted.offset || m.length != granted.length) {
      continue;
    }
    const NicHot& s = hot_[m.sender];
    if (next_applied_to > m.deadline) continue;  // hopeless: the next scan drops it
    if (s.in_flight > 0 && s.in_flight + m.length > credit) continue;
    const Instant ready = std::max(now, s.egress_tail);
    if (ready >= wait_behind || wait_behind - ready < config_.aggregation.min_wait) continue;
    const EndpointId sender_id = endpoints_[m.sender].id;
    waiting.push_back(GroupCandidate{m.sender, sender_id, RequestId{m.id}, m.part, ready,
                                     bandwidth_.rate(sender_id, Direction::egress), m.duration, m.deadline});
  }
  const auto is_pick = [&](const GroupCandidate& m) {
    return to_int(m.request) == granted.id && m.part == granted.part;
  };
  const auto has_pick = [&](const std::vector<GroupCandidate>& group) {
    return std::any_of(group.begin(), group.end(), is_pick);
  };
  // A relay (a group of one) is only ever the pick itself.
  const bool may_relay = pick_joins && config_.aggregation.relay_ratio > 0 && has_pick(waiting);
  if (waiting.size() < config_.aggregation.min_group && !may_relay) return false;
  std::optional<GroupCandidate> pick_member;
  if (may_relay) pick_member = *std::find_if(waiting.begin(), waiting.end(), is_pick);
  std::vector<GroupCandidate> members =
      choose_members(config_.aggregation, std::move(waiting), endpoints_[receiver].reservations, next_applied_to);
  if (members.empty() || (pick_joins && !has_pick(members))) {
    if (!may_relay || !endpoints_[receiver].reservations.feasible_with(next_applied_to, pick_member->deadline)) {
      return false;
    }
    members = {*pick_member};
  }

  // Shortlist the least busy aggregators of the job; members and the server cannot aggregate.
  std::vector<std::pair<Instant, Index>> shortlist;
  for (const Index a : job_aggregators->second) {
    if (a == receiver) continue;
    if (std::any_of(members.begin(), members.end(), [a](const GroupCandidate& m) { return m.tag == a; })) {
      continue;
    }
    const EndpointState& e = endpoints_[a];
    shortlist.emplace_back(std::max({now, ingress_free(e), e.egress.tail(), e.forwards_done}), a);
  }
  const std::size_t k = std::min<std::size_t>(shortlist.size(), config_.aggregation.shortlist);
  std::partial_sort(shortlist.begin(), shortlist.begin() + static_cast<std::ptrdiff_t>(k), shortlist.end(),
                    [this](const auto& x, const auto& y) {
                      return std::tuple(x.first, to_int(endpoints_[x.second].id)) <
                             std::tuple(y.first, to_int(endpoints_[y.second].id));
                    });
  std::vector<AggregatorOption> options;
  options.reserve(k);
  for (std::size_t i = 0; i < k; ++i) {
    const EndpointState& e = endpoints_[shortlist[i].second];
    options.push_back(AggregatorOption{e.id, ingress_free(e), std::max(e.egress.tail(), e.forwards_done),
                                       bandwidth_.rate(e.id, Direction::ingress),
                                       bandwidth_.rate(e.id, Direction::egress), sender_copies(receiver)});
  }
  const double server_rate = bandwidth_.rate(endpoints_[receiver].id, Direction::ingress);
  const std::optional<GroupPlan> plan =
      members.size() == 1
          ? choose_relay(config_.aggregation, now, members.front(), granted.length, options, server_free, server_rate)
          : choose_aggregator(config_.aggregation, now, members, granted.length, options, server_free, server_rate);
  if (!plan || (pick_joins && !has_pick(plan->members))) return false;

  // Commit: redirect every member, then offer the aggregate as a candidate of its own.
  const AggregateId id{next_aggregate_++};
  const Index aggregator = index_.at(plan->aggregator);
  EndpointState& a = endpoints_[aggregator];
  a.ingress.retire_before(now);
  a.shares.retire_before(now);
  a.forwards_done = std::max(a.forwards_done, plan->predicted_done);
  // (a's ingress tail is mirrored below, once every member's slot is booked)
  PendingAggregate g{aggregator,     receiver, granted.job, granted.tensor, granted.offset,
                     granted.length, {},       kNoDeadline, kNone};
  Version group_deadline_version = kNoDeadline;
  for (std::size_t i = 0; i < plan->members.size(); ++i) {
    const GroupCandidate& m = plan->members[i];
    const Slot& slot = plan->member_slots[i];
    const Index sender = static_cast<Index>(m.tag);
    EndpointState& s = endpoints_[sender];
    const Candidate mc = candidates_[static_cast<std::size_t>(s.head)];
    RequestState& q = requests_.at(m.request);

    const QueuedPart part = s.queue.pop(mc.job);
    assert(part.request == m.request && part.index == m.part);
    s.queue.served(mc.job, part.length);
    s.egress.retire_before(now);
    [[maybe_unused]] const bool booked_out = s.egress.reserve(slot);
    [[maybe_unused]] const bool booked_in = a.ingress.reserve(slot) && (!packed() || a.shares.book(slot, 1.0));
    assert(booked_out && booked_in);
    sync_egress(sender);
    hot_[sender].in_flight += part.length;

    g.members.push_back(PartRef{m.request, part.index});
    g.base = std::min(g.base, q.request.computed_on + q.parts_sequenced);
    group_deadline_version = std::min(group_deadline_version, mc.deadline);
    out.emplace_back(Redirect{record_transfer(sender, aggregator, part.length, slot, true), q.request.id, part.index,
                              part.count, part.offset, part.length, q.request.job, q.request.tensor, q.request.sender,
                              a.id, endpoints_[receiver].id, id, slot});
    ++stats_.redirects;
    ++stats_.decisions;
    finish_request_part(q, /*sequenced=*/false);  // may erase q

    remove_candidate(s.head);
    s.head = kNone;
    refresh_head(sender);
  }

  Candidate ac;
  ac.not_before = plan->sum_ready;
  ac.duration = path_time(aggregator, receiver, granted.length);
  ac.deadline = group_deadline_version;
  ac.sender = aggregator;
  ac.receiver = receiver;
  ac.length = granted.length;
  ac.id = to_int(id);
  ac.aggregate = true;
  ac.job = granted.job;
  ac.tensor = granted.tensor;
  ac.offset = granted.offset;
  g.candidate = add_candidate(ac);
  aggregates_.emplace(id, std::move(g));
  endpoints_[receiver].reservations.insert(group_deadline_version, id);
  sync_receiver(aggregator);
  sync_receiver(receiver);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Bookkeeping

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
