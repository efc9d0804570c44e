// The parameter server's roles as Prometheus sources (gradlane/ps/metrics.hpp).
#include <algorithm>
#include <utility>
#include <vector>

#include "gradlane/ps/metrics.hpp"

namespace gradlane::ps {
namespace {

using metrics::add_counter;
using metrics::add_gauge;
using metrics::family;
using prometheus::MetricType;

// Versions between the model an update was computed on and the one it was applied to.
const std::vector<double> kStalenessBounds = {0, 1, 2, 4, 8, 16, 32, 64, 128};
// A push over rxe takes milliseconds; one held behind a slow link or a full window, seconds.
const std::vector<double> kPushBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

double as_double(std::uint64_t v) { return static_cast<double>(v); }

}  // namespace

ServerMetrics::ServerMetrics(std::string role, std::uint64_t update_bytes)
    : role_(std::move(role)), update_bytes_(update_bytes), staleness_(kStalenessBounds) {}

void ServerMetrics::update(const ShardServer& server) { update(server.stats(), server.history(), server.version()); }

void ServerMetrics::update(const ServerStats& stats, std::span<const AppliedUpdate> history, std::uint64_t version) {
  const std::lock_guard lock(mutex_);
  stats_ = stats;
  version_ = version;
  for (; seen_ < history.size(); ++seen_) {
    const AppliedUpdate& u = history[seen_];
    if (u.skipped) continue;
    PerWorker& w = workers_[u.worker];
    ++w.updates;
    // Applied to version sequence - 1; a computed_on past it is not a staleness (never granted).
    if (u.sequence >= 1 && u.computed_on <= u.sequence - 1) {
      const std::uint64_t staleness = u.sequence - 1 - u.computed_on;
      staleness_.observe(as_double(staleness));
      w.staleness_sum += staleness;
      ++w.with_staleness;
    }
  }
}

std::vector<prometheus::MetricFamily> ServerMetrics::Collect() const {
  const std::lock_guard lock(mutex_);
  const metrics::Labels role{{"role", role_}};
  const auto with = [&](std::string name, std::string value) {
    auto labels = role;
    labels.emplace(std::move(name), std::move(value));
    return labels;
  };
  std::vector<prometheus::MetricFamily> out;

  auto updates = family("gradlane_server_updates_total", "Sequences decided: applied to the shard, or skipped (holes)",
                        MetricType::Counter);
  add_counter(updates, with("outcome", "applied"), as_double(stats_.applied));
  add_counter(updates, with("outcome", "skipped"), as_double(stats_.skipped));
  out.push_back(std::move(updates));

  auto granted = family("gradlane_server_granted_total", "Sequence numbers this server handed out (direct mode)",
                        MetricType::Counter);
  add_counter(granted, role, as_double(stats_.granted));
  out.push_back(std::move(granted));

  auto refused = family("gradlane_server_refused_total", "Messages refused, by what was refused", MetricType::Counter);
  add_counter(refused, with("what", "doorbell"), as_double(stats_.refused_doorbells));
  add_counter(refused, with("what", "cancel"), as_double(stats_.refused_cancels));
  add_counter(refused, with("what", "round"), as_double(stats_.refused_rounds));
  add_counter(refused, with("what", "request"), as_double(stats_.refused_requests));
  add_counter(refused, with("what", "claim"), as_double(stats_.refused_claims));
  add_counter(refused, with("what", "join"), as_double(stats_.joins_refused));
  out.push_back(std::move(refused));

  auto peers = family("gradlane_server_peers_total", "Worker connections: joined late, left cleanly, or lost",
                      MetricType::Counter);
  add_counter(peers, with("event", "joined"), as_double(stats_.peers_joined));
  add_counter(peers, with("event", "left"), as_double(stats_.peers_left));
  add_counter(peers, with("event", "lost"), as_double(stats_.peers_lost));
  out.push_back(std::move(peers));

  auto bytes =
      family("gradlane_server_applied_bytes_total", "Bytes of the updates applied to the shard", MetricType::Counter);
  add_counter(bytes, role, as_double(stats_.applied) * as_double(update_bytes_));
  out.push_back(std::move(bytes));

  auto version = family("gradlane_server_version", "The shard's model version (sequences decided)", MetricType::Gauge);
  add_gauge(version, role, as_double(version_));
  out.push_back(std::move(version));

  // A server's decisions its replica has not acknowledged yet (0 without a replica).
  auto lag = family("gradlane_server_replica_lag", "Decided sequences the replica has not acknowledged (server)",
                    MetricType::Gauge);
  const std::uint64_t decided = stats_.applied + stats_.skipped;
  add_gauge(lag, role,
            role_ == "server" && stats_.has_replica && decided > stats_.replica_acked
                ? as_double(decided - stats_.replica_acked)
                : 0.0);
  out.push_back(std::move(lag));

  auto failover = family("gradlane_server_failover_total",
                         "Failover events: promoted (replica), stepped_down (server), sidecar_resumed, "
                         "lost_in_failover (decided updates a promoted replica could not apply)",
                         MetricType::Counter);
  add_counter(failover, with("event", "promoted"), stats_.promoted_at_ns != 0 ? 1.0 : 0.0);
  add_counter(failover, with("event", "stepped_down"), stats_.stepped_down ? 1.0 : 0.0);
  add_counter(failover, with("event", "sidecar_resumed"), as_double(stats_.sidecars_resumed));
  add_counter(failover, with("event", "lost_in_failover"), as_double(stats_.lost_in_failover));
  add_counter(failover, with("event", "mirror_fetched"), as_double(stats_.mirrors_fetched));
  out.push_back(std::move(failover));

  auto staleness = family("gradlane_server_staleness",
                          "Versions between an applied update's model and the one it was "
                          "computed on",
                          MetricType::Histogram);
  staleness.metric.push_back(staleness_.metric(role));
  out.push_back(std::move(staleness));

  auto per_worker = family("gradlane_server_worker_updates_total", "Updates applied, by worker", MetricType::Counter);
  auto stale_sum = family("gradlane_server_worker_staleness_sum", "Summed staleness of a worker's applied updates",
                          MetricType::Counter);
  auto score = family("gradlane_server_worker_straggler_score",
                      "(a worker's mean staleness + 1) / (the median over workers + 1): 1 is typical, a straggler's "
                      "updates are the stalest",
                      MetricType::Gauge);
  std::vector<double> means;
  for (const auto& [worker, w] : workers_) {
    if (w.with_staleness > 0) means.push_back(as_double(w.staleness_sum) / as_double(w.with_staleness));
  }
  const double typical = metrics::median(means);
  for (const auto& [worker, w] : workers_) {
    const auto labels = with("worker", std::to_string(worker));
    add_counter(per_worker, labels, as_double(w.updates));
    add_counter(stale_sum, labels, as_double(w.staleness_sum));
    if (w.with_staleness > 0) {
      add_gauge(score, labels, (as_double(w.staleness_sum) / as_double(w.with_staleness) + 1.0) / (typical + 1.0));
    }
  }
  out.push_back(std::move(per_worker));
  out.push_back(std::move(stale_sum));
  out.push_back(std::move(score));
  return out;
}

WorkerMetrics::WorkerMetrics(std::uint32_t worker) : worker_(std::to_string(worker)), push_seconds_(kPushBounds) {}

void WorkerMetrics::record(const PushResult& result, std::chrono::nanoseconds took) {
  const std::lock_guard lock(mutex_);
  if (result.dropped) {
    ++dropped_;
  } else if (result.lost) {
    ++lost_;
  } else if (result.pending) {
    ++pending_;
  } else {
    ++acknowledged_;
  }
  expired_grants_ += result.expired_grants;
  push_seconds_.observe(std::chrono::duration<double>(took).count());
}

std::vector<prometheus::MetricFamily> WorkerMetrics::Collect() const {
  const std::lock_guard lock(mutex_);
  const metrics::Labels worker{{"worker", worker_}};
  const auto with = [&](std::string value) {
    auto labels = worker;
    labels.emplace("outcome", std::move(value));
    return labels;
  };
  std::vector<prometheus::MetricFamily> out;
  auto pushes = family("gradlane_worker_pushes_total",
                       "Pushes by outcome: acknowledged, dropped (too stale; pull again), lost (its server failed "
                       "mid-push), pending (at an aggregator)",
                       MetricType::Counter);
  add_counter(pushes, with("acknowledged"), as_double(acknowledged_));
  add_counter(pushes, with("dropped"), as_double(dropped_));
  add_counter(pushes, with("lost"), as_double(lost_));
  add_counter(pushes, with("pending"), as_double(pending_));
  out.push_back(std::move(pushes));
  auto expired = family("gradlane_worker_expired_grants_total", "Grants taken up too late to write (asked again)",
                        MetricType::Counter);
  add_counter(expired, worker, as_double(expired_grants_));
  out.push_back(std::move(expired));
  auto seconds =
      family("gradlane_worker_push_seconds", "Time a push() took, grant wait included", MetricType::Histogram);
  seconds.metric.push_back(push_seconds_.metric(worker));
  out.push_back(std::move(seconds));
  return out;
}

void AggregatorMetrics::update(const AggregatorStats& stats) {
  const std::lock_guard lock(mutex_);
  stats_ = stats;
}

std::vector<prometheus::MetricFamily> AggregatorMetrics::Collect() const {
  const std::lock_guard lock(mutex_);
  std::vector<prometheus::MetricFamily> out;
  auto members =
      family("gradlane_aggregator_members_total",
             "Member updates: granted, summed into a forward, skipped (never came), displaced", MetricType::Counter);
  add_counter(members, {{"event", "granted"}}, as_double(stats_.granted));
  add_counter(members, {{"event", "summed"}}, as_double(stats_.summed));
  add_counter(members, {{"event", "skipped"}}, as_double(stats_.skipped));
  add_counter(members, {{"event", "displaced"}}, as_double(stats_.displaced));
  out.push_back(std::move(members));
  auto forwards = family("gradlane_aggregator_forwards_total",
                         "Sums pushed to the server: all, of which short groups, lost, cancelled", MetricType::Counter);
  add_counter(forwards, {{"event", "forwarded"}}, as_double(stats_.forwarded));
  add_counter(forwards, {{"event", "short_group"}}, as_double(stats_.short_groups));
  add_counter(forwards, {{"event", "lost"}}, as_double(stats_.lost));
  add_counter(forwards, {{"event", "cancelled"}}, as_double(stats_.cancelled));
  out.push_back(std::move(forwards));
  auto peers = family("gradlane_aggregator_peers_total", "Worker connections: joined late, left, lost; rejoins",
                      MetricType::Counter);
  add_counter(peers, {{"event", "joined"}}, as_double(stats_.peers_joined));
  add_counter(peers, {{"event", "left"}}, as_double(stats_.peers_left));
  add_counter(peers, {{"event", "lost"}}, as_double(stats_.peers_lost));
  add_counter(peers, {{"event", "rejoined"}}, as_double(stats_.rejoins));
  out.push_back(std::move(peers));
  auto refused = family("gradlane_aggregator_refused_doorbells_total", "Doorbells for a sequence not granted, or done",
                        MetricType::Counter);
  add_counter(refused, {}, as_double(stats_.refused_doorbells));
  out.push_back(std::move(refused));
  auto copied = family("gradlane_aggregator_copied_bytes_total",
                       "Bytes the CPU copied (a group of one; inline forwards)", MetricType::Counter);
  add_counter(copied, {}, as_double(stats_.bytes_copied));
  out.push_back(std::move(copied));
  return out;
}

}  // namespace gradlane::ps
