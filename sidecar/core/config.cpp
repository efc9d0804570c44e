#include "sidecar/core/config.hpp"

#include <algorithm>

namespace gradlane::sched {

std::optional<std::string> SchedulerConfig::validate() const {
  if (replica_bound && *replica_bound == 0) {
    return "replica_bound must be >= 1 (0 would never let a sequence number be granted); "
           "use nullopt for a server without a replica";
  }
  if (partition_align == 0) return "partition_align must be >= 1";
  if (partition_bytes < partition_align) return "partition_bytes must be >= partition_align";
  if (credit_bytes == 0) return "credit_bytes must be > 0";
  if (!(tenant_floor_share >= 0.0 && tenant_floor_share <= 1.0)) {
    return "tenant_floor_share must be in [0, 1]";
  }
  if (job_sharing == JobSharing::priority && job_priority.empty()) {
    return "job_sharing priority needs job_priority: the jobs in the order they are served";
  }
  if (job_sharing != JobSharing::priority && !job_priority.empty()) {
    return "job_priority orders jobs only under job_sharing priority: give both, or neither";
  }
  for (auto it = job_priority.begin(); it != job_priority.end(); ++it) {
    if (std::find(job_priority.begin(), it, *it) != it) return "job_priority names a job twice";
  }
  if (grant_horizon < Nanos::zero()) return "grant_horizon must be >= 0";
  if (aggregation.min_group < 2) return "aggregation.min_group must be >= 2";
  if (aggregation.max_group < aggregation.min_group) {
    return "aggregation.max_group must be >= aggregation.min_group";
  }
  if (aggregation.shortlist == 0) return "aggregation.shortlist must be >= 1";
  if (!(aggregation.relay_ratio >= 0.0)) return "aggregation.relay_ratio must be >= 0 (0: no relays)";
  if (aggregation.min_wait < Nanos::zero() || aggregation.sum_time < Nanos::zero()) {
    return "aggregation.min_wait and aggregation.sum_time must be >= 0";
  }
  if (!(bandwidth.default_bytes_per_sec > 0.0) || !(bandwidth.min_bytes_per_sec > 0.0)) {
    return "bandwidth rates must be > 0";
  }
  if (!(bandwidth.republish_fraction >= 0.0)) return "bandwidth.republish_fraction must be >= 0";
  if (!(bandwidth.gross_error > 1.0)) return "bandwidth.gross_error must be > 1";
  if (!(bandwidth.ewma_weight > 0.0 && bandwidth.ewma_weight <= 1.0)) {
    return "bandwidth.ewma_weight must be in (0, 1]";
  }
  return std::nullopt;
}

}  // namespace gradlane::sched
