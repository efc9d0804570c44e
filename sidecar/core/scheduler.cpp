// Scheduler (scheduler.hpp): its endpoints, its inputs and what it shows. One decision is in
// scheduler_scan.cpp (which part goes next) and scheduler_grant.cpp (booking and granting it);
// the candidates' owners and transfer records in scheduler_bookkeeping.cpp, the candidates
// themselves in CandidateTable (candidate_table.hpp).
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
      bandwidth_generation_(bandwidth_.generation()),
      candidates_(config_.ordering, config_.ingress == IngressSharing::packed) {
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
  const double receiver_rate = bandwidth_.line_rate(endpoints_[c.receiver].id, Direction::ingress);
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
    if (candidate(pick.index).aggregate) {
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
    cancels_.push_back(
        Cancel{transfer, rec.job, endpoints_[rec.receiver].id, rec.seq, result == TransferResult::sender_lost});
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

}  // namespace gradlane::sched
