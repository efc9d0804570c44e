// Scheduler, one decision's second half: booking the picked part's slots and granting it, alone
// or folded into an aggregate with the parts that can join it.
#include "sidecar/core/scheduler.hpp"

#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <string>
#include <tuple>

#include "sidecar/core/aggregation.hpp"

namespace gradlane::sched {

void Scheduler::grant_part(const Pick& pick, Instant now, std::vector<Outcome>& out) {
  const Candidate c = candidate(pick.index);
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
  const Candidate c = candidate(pick.index);
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
    if (sender.head != kNone && candidate(sender.head).id == to_int(m.request)) {
      candidates_.set_deadline(
          static_cast<std::uint32_t>(sender.head),
          deadline(q->second.request.computed_on, q->second.parts_sequenced, config_.staleness_bound));
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
  for (const Candidate& m : candidates_.all()) {
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
    const Candidate mc = candidate(s.head);
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

}  // namespace gradlane::sched
