// Aggregation planning (MLfabric ordering + MLNet traffic reduction).
//
// When the server's ingress is busy, updates queued behind it would wait. If several of them
// are the same slice of the same tensor of the same job, they can be summed off-server: they
// are redirected to an aggregator (a worker of that job with spare bandwidth), which adds them
// with Eigen and forwards one update. The server then spends one slot and one version on the
// whole group instead of one per member, which cuts its ingress load (R1 in MLfabric) and keeps
// everyone's delay down (R2).
//
// Pure functions over plain inputs, so the choices are testable on their own:
//  - choose_members: which waiting updates form the group. Shortest transfer first (they are
//    the ones that reach the aggregator soonest), at most max_group of them, and only as many
//    as keep the aggregate's deadline feasible next to the server's other reservations; the
//    stalest are left out first because they are the ones that make a group infeasible.
//  - choose_aggregator: where to sum. For each option, the members' transfers are laid out back
//    to back on the aggregator's ingress (receiver-driven, like any ingress), then the sum
//    goes to the server. An option qualifies only if it has spare bandwidth in this precise
//    sense: it can collect and sum the whole group no later than the server itself would have
//    finished receiving the members one by one. (Requiring the *sum* to reach the server
//    before that would never hold with equal link speeds — the members are serialized at the
//    aggregator's ingress just as at the server's — and would miss the point: the win is the
//    k-1 server slots and versions saved, which the server spends on other updates.) Of the
//    qualifying options, the one whose sum would reach the server first wins (ties: lower
//    endpoint id). MLfabric picks an aggregator at random; predicting from the measured
//    bandwidth instead never picks a straggler and keeps the choice reproducible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "sidecar/core/staleness.hpp"
#include "sidecar/core/types.hpp"

namespace gradlane::sched {

struct AggregationConfig {
  bool enabled = true;
  // Fewer than two is not a group; a group of two already halves the server slots it needs.
  std::uint32_t min_group = 2;
  // Upper bound on members per aggregate: bounds the aggregator's fan-in (its ingress time and
  // the memory it registers for incoming parts) and the latency of the sum.
  std::uint32_t max_group = 16;
  // An update joins a group only if it would otherwise wait at least this long for the
  // server's ingress. 0: any wait qualifies; the benefit test in choose_aggregator decides.
  Nanos min_wait{0};
  // Aggregators evaluated per group (the least busy ones). Bounds the cost of a decision when a
  // job has hundreds of workers offering to aggregate.
  std::uint32_t shortlist = 8;
  // Time the aggregator needs to sum a group once the last member has arrived. 20 us covers an
  // Eigen sum of 16 x 4 MiB at memory bandwidth on a server core, roughly.
  Nanos sum_time{20'000};
  // Also consider the update about to be granted (the pick) as a member: it and those that
  // would wait behind it go to the aggregator if that beats sending it to the server now (the
  // benefit test below). Off, a group is formed only of those behind the pick: with n senders
  // taking turns, at most n - 2 wait at a grant (one is granted, one is computing), so groups
  // stay small. On pays where the senders' links are much faster than the server's ingress
  // (the aggregator collects in a fraction of a server slot); with equal links it never
  // qualifies. Default off: the scheduler simulator's figures are measured without it.
  bool pick_joins = false;
  // With pick_joins: the pick alone goes through an aggregator (a relay, a group of one) when
  // its transfer straight to the server would hold the server's ingress at least this many
  // times longer than the aggregator's forward: a straggler's slow update then occupies the
  // aggregator's ingress, not the server's. 0: never.
  double relay_ratio = 0;
  // Endpoints that may aggregate a job's updates from the start (gradlaned --aggregator
  // JOB:ENDPOINT): an app of that job attached from that endpoint sums what is redirected to it.
  // Scheduler::add_aggregator adds one later.
  struct Seat {
    JobId job{};
    EndpointId endpoint{};
  };
  std::vector<Seat> aggregators;
};

// A waiting update that could join a group.
struct GroupCandidate {
  std::size_t tag = 0;  // the caller's handle, returned in the plan
  EndpointId sender{};
  RequestId request{};
  std::uint32_t part = 0;
  Instant ready{};                 // earliest its sender's egress can start it
  double egress_rate = 0;          // sender's estimated egress, bytes/s
  Nanos direct_time{};             // its transfer time straight to the server
  Version deadline = kNoDeadline;  // latest version it may be applied to
};

// Members in the order they were chosen (shortest transfer first).
std::vector<GroupCandidate> choose_members(const AggregationConfig& config, std::vector<GroupCandidate> waiting,
                                           const DeadlineReservations& reservations, Version next_applied_to);

// Latest version the aggregate of `members` may be applied to: its stalest member's deadline.
Version group_deadline(std::span<const GroupCandidate> members) noexcept;

struct AggregatorOption {
  EndpointId id{};
  Instant ingress_free{};
  Instant egress_free{};
  double ingress_rate = 0;
  double egress_rate = 0;
  unsigned forward_copies = 1;  // copies its forward sends (2: it mirrors to the replica)
};

struct GroupPlan {
  EndpointId aggregator{};
  std::vector<GroupCandidate> members;  // in arrival order at the aggregator
  std::vector<Slot> member_slots;       // members[i] -> aggregator, on both NICs' timelines
  Instant sum_ready{};                  // all members arrived and summed
  Nanos forward_time{};                 // the aggregate's transfer time to the server
  Instant predicted_done{};             // when the aggregate would reach the server
};

// server_free: when the server's ingress is next free; server_rate: its ingress estimate.
// latest_start: members whose transfer to the aggregator could not start by then stay out of
// the group; an option left with fewer than min_group members does not qualify. The scheduler
// does not limit it by the grant horizon: the horizon keeps the *server's* order open to
// later arrivals, while a group's members are booked back to back at the aggregator when the
// group is formed (at most max_group slots), and capping them at the horizon would leave no
// group at all under a short horizon.
// Precondition: options exclude the server and the members' own senders.
std::optional<GroupPlan> choose_aggregator(const AggregationConfig& config, Instant now,
                                           std::span<const GroupCandidate> members, Bytes length,
                                           std::span<const AggregatorOption> options, Instant server_free,
                                           double server_rate, Instant latest_start = Instant::max());

// A relay: `member` alone through the aggregator whose forward reaches the server first, among
// those whose forward would take at most 1/relay_ratio of the member's direct transfer (so the
// server's ingress is held that much less). nullopt if none qualifies or relay_ratio is 0.
std::optional<GroupPlan> choose_relay(const AggregationConfig& config, Instant now, const GroupCandidate& member,
                                      Bytes length, std::span<const AggregatorOption> options, Instant server_free,
                                      double server_rate);

}  // namespace gradlane::sched
