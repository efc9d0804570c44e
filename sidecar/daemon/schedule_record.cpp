#include "sidecar/daemon/schedule_record.hpp"

#include <chrono>
#include <vector>

#include "common/overloaded.hpp"

namespace gradlane::sidecar {
namespace {

// A grant's delay is bounded by τ (8 by default, rarely above 64).
const std::vector<double> kStalenessBounds = {0, 1, 2, 4, 8, 16, 32, 64};
// Submission to settlement: a grant wait plus a write, from a millisecond to a slow link's seconds.
const std::vector<double> kPushBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

}  // namespace

ScheduleRecord::ScheduleRecord() : staleness_(kStalenessBounds) {}

void ScheduleRecord::decided(const sched::Outcome& outcome) {
  std::visit(detail::Overloaded{
                 [&](const sched::Grant& g) {
                   ++counts_.grants;
                   counts_.granted_bytes += g.length;
                   staleness_.observe(static_cast<double>(g.delay));
                 },
                 [&](const sched::Redirect& r) {
                   ++counts_.redirects;
                   counts_.granted_bytes += r.length;
                 },
                 [&](const sched::AggregateGrant& a) {
                   ++counts_.aggregates;
                   counts_.granted_bytes += a.length;
                   staleness_.observe(static_cast<double>(a.delay));
                 },
                 [&](const sched::Drop& d) { ++counts_.drops.at(static_cast<std::size_t>(d.reason)); },
                 [&](const sched::Cancel&) { ++counts_.cancels; },
             },
             outcome);
}

void ScheduleRecord::settled(std::uint32_t sender, sched::Nanos took) {
  auto it = push_seconds_.find(sender);
  if (it == push_seconds_.end()) {
    it = push_seconds_.try_emplace(push_seconds_.size() < kMaxSenders ? sender : kOtherSenders, kPushBounds).first;
  }
  it->second.observe(std::chrono::duration<double>(took).count());
}

}  // namespace gradlane::sidecar
