#include "sidecar/core/aggregation.hpp"

#include <algorithm>
#include <tuple>

#include "sidecar/core/bandwidth.hpp"

namespace gradlane::sched {

std::vector<GroupCandidate> choose_members(const AggregationConfig& config, std::vector<GroupCandidate> waiting,
                                           const DeadlineReservations& reservations, Version next_applied_to) {
  std::sort(waiting.begin(), waiting.end(), [](const GroupCandidate& a, const GroupCandidate& b) {
    return std::tuple(a.direct_time, to_int(a.request), a.part) < std::tuple(b.direct_time, to_int(b.request), b.part);
  });
  if (waiting.size() > config.max_group) waiting.resize(config.max_group);
  while (waiting.size() >= config.min_group && !reservations.feasible_with(next_applied_to, group_deadline(waiting))) {
    // Leave out the stalest member: it is the one pulling the group's deadline in.
    const auto stalest =
        std::min_element(waiting.begin(), waiting.end(), [](const GroupCandidate& a, const GroupCandidate& b) {
          return std::tuple(a.deadline, to_int(a.request), a.part) < std::tuple(b.deadline, to_int(b.request), b.part);
        });
    waiting.erase(stalest);
  }
  if (waiting.size() < config.min_group) waiting.clear();
  return waiting;
}

Version group_deadline(std::span<const GroupCandidate> members) noexcept {
  Version d = kNoDeadline;
  for (const GroupCandidate& m : members) d = std::min(d, m.deadline);
  return d;
}

std::optional<GroupPlan> choose_aggregator(const AggregationConfig& config, Instant now,
                                           std::span<const GroupCandidate> members, Bytes length,
                                           std::span<const AggregatorOption> options, Instant server_free,
                                           double server_rate, Instant latest_start) {
  if (members.size() < config.min_group) return std::nullopt;

  std::vector<GroupCandidate> arrival(members.begin(), members.end());
  std::sort(arrival.begin(), arrival.end(), [](const GroupCandidate& a, const GroupCandidate& b) {
    return std::tuple(a.ready, to_int(a.request), a.part) < std::tuple(b.ready, to_int(b.request), b.part);
  });

  std::optional<GroupPlan> best;
  std::vector<GroupCandidate> joined;
  std::vector<Slot> slots;
  for (const AggregatorOption& a : options) {
    joined.clear();
    slots.clear();
    Instant t = std::max(now, a.ingress_free);
    // Sent one by one straight to the server, the last member would land at direct_done.
    Instant direct_done = server_free;
    for (const GroupCandidate& m : arrival) {
      const Instant start = std::max(m.ready, t);
      if (start > latest_start) continue;  // beyond the horizon: stays for a later pass
      t = start + transfer_time(length, std::min(m.egress_rate, a.ingress_rate));
      joined.push_back(m);
      slots.push_back(Slot{start, t});
      direct_done += m.direct_time;
    }
    if (joined.size() < config.min_group) continue;
    const Instant sum_ready = t + config.sum_time;
    if (sum_ready > direct_done) continue;  // no spare bandwidth: the server would be faster
    const Nanos forward = mirrored_transfer_time(length, a.forward_copies, a.egress_rate, server_rate);
    const Instant done = std::max({sum_ready, a.egress_free, server_free}) + forward;
    if (!best || std::tuple(done, to_int(a.id)) < std::tuple(best->predicted_done, to_int(best->aggregator))) {
      best = GroupPlan{a.id, joined, slots, sum_ready, forward, done};
    }
  }
  return best;
}

std::optional<GroupPlan> choose_relay(const AggregationConfig& config, Instant now, const GroupCandidate& member,
                                      Bytes length, std::span<const AggregatorOption> options, Instant server_free,
                                      double server_rate) {
  if (!(config.relay_ratio > 0)) return std::nullopt;
  std::optional<GroupPlan> best;
  for (const AggregatorOption& a : options) {
    const Nanos forward = mirrored_transfer_time(length, a.forward_copies, a.egress_rate, server_rate);
    if (static_cast<double>(member.direct_time.count()) < config.relay_ratio * static_cast<double>(forward.count())) {
      continue;  // the server's ingress would not be held much less
    }
    const Instant start = std::max({now, member.ready, a.ingress_free});
    const Instant arrived = start + transfer_time(length, std::min(member.egress_rate, a.ingress_rate));
    const Instant sum_ready = arrived + config.sum_time;
    const Instant done = std::max({sum_ready, a.egress_free, server_free}) + forward;
    if (!best || std::tuple(done, to_int(a.id)) < std::tuple(best->predicted_done, to_int(best->aggregator))) {
      best = GroupPlan{a.id, {member}, {Slot{start, arrived}}, sum_ready, forward, done};
    }
  }
  return best;
}

}  // namespace gradlane::sched
