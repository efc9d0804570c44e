#include "sidecar/daemon/daemon_metrics.hpp"

#include <algorithm>
#include <string>

namespace gradlane::sidecar {
namespace {

using metrics::add_counter;
using metrics::add_gauge;
using metrics::family;
using prometheus::MetricType;

double as_double(std::uint64_t v) { return static_cast<double>(v); }

}  // namespace

void DaemonMetrics::update(const Daemon& daemon) {
  const std::lock_guard lock(mutex_);
  stats_ = daemon.stats();
  record_ = daemon.record();
  apps_ = daemon.attached_apps();
}

std::vector<prometheus::MetricFamily> DaemonMetrics::Collect() const {
  const std::lock_guard lock(mutex_);
  std::vector<prometheus::MetricFamily> out;

  auto apps = family("gradlaned_apps", "Applications attached now", MetricType::Gauge);
  add_gauge(apps, {}, static_cast<double>(apps_));
  out.push_back(std::move(apps));

  auto lifecycle = family("gradlaned_app_events_total",
                          "Attaches accepted and refused, clean detaches, dead apps reclaimed, apps evicted (corrupt "
                          "queues)",
                          MetricType::Counter);
  add_counter(lifecycle, {{"event", "attached"}}, as_double(stats_.attached));
  add_counter(lifecycle, {{"event", "rejected"}}, as_double(stats_.rejected));
  add_counter(lifecycle, {{"event", "detached"}}, as_double(stats_.detached));
  add_counter(lifecycle, {{"event", "reclaimed"}}, as_double(stats_.reclaimed));
  add_counter(lifecycle, {{"event", "evicted"}}, as_double(stats_.evicted));
  out.push_back(std::move(lifecycle));

  auto entries = family("gradlaned_entries_total",
                        "Entries exchanged with apps: requests submitted, completions, answers, error answers",
                        MetricType::Counter);
  add_counter(entries, {{"entry", "submitted"}}, as_double(stats_.submitted));
  add_counter(entries, {{"entry", "completed"}}, as_double(stats_.completed));
  add_counter(entries, {{"entry", "answer"}}, as_double(stats_.answers));
  add_counter(entries, {{"entry", "error"}}, as_double(stats_.errors));
  out.push_back(std::move(entries));

  const OutcomeCounts& c = record_.counts();
  auto decisions = family("gradlaned_decisions_total",
                          "Scheduling decisions: parts granted to their server, redirected to an aggregator, "
                          "aggregates granted, granted sequences cancelled",
                          MetricType::Counter);
  add_counter(decisions, {{"kind", "grant"}}, as_double(c.grants));
  add_counter(decisions, {{"kind", "redirect"}}, as_double(c.redirects));
  add_counter(decisions, {{"kind", "aggregate"}}, as_double(c.aggregates));
  add_counter(decisions, {{"kind", "cancel"}}, as_double(c.cancels));
  out.push_back(std::move(decisions));

  auto drops = family("gradlaned_drops_total", "Parts dropped, by reason", MetricType::Counter);
  for (std::size_t r = 0; r < c.drops.size(); ++r) {
    add_counter(drops, {{"reason", std::string(sched::drop_reason_name(static_cast<sched::DropReason>(r)))}},
                as_double(c.drops[r]));
  }
  out.push_back(std::move(drops));

  auto bytes = family("gradlaned_granted_bytes_total", "Bytes of the parts granted, redirected and aggregated",
                      MetricType::Counter);
  add_counter(bytes, {}, as_double(c.granted_bytes));
  out.push_back(std::move(bytes));

  auto staleness = family("gradlaned_grant_staleness", "The delay a granted update will be applied at (<= tau)",
                          MetricType::Histogram);
  staleness.metric.push_back(record_.staleness().metric({}));
  out.push_back(std::move(staleness));

  auto push =
      family("gradlaned_push_seconds", "Submission to settlement of a push, by sender endpoint", MetricType::Histogram);
  auto score = family("gradlaned_straggler_score",
                      "A sender's mean push time over the median of the senders' means (1: typical; a straggler's "
                      "pushes take longest)",
                      MetricType::Gauge);
  std::vector<double> means;
  for (const auto& [sender, h] : record_.push_seconds()) {
    if (h.count() > 0) means.push_back(h.sum() / static_cast<double>(h.count()));
  }
  const double median = metrics::median(std::move(means));
  for (const auto& [sender, h] : record_.push_seconds()) {
    const metrics::Labels labels{
        {"sender", sender == ScheduleRecord::kOtherSenders ? std::string("other") : std::to_string(sender)}};
    push.metric.push_back(h.metric(labels));
    if (h.count() > 0 && median > 0) add_gauge(score, labels, h.sum() / static_cast<double>(h.count()) / median);
  }
  out.push_back(std::move(push));
  out.push_back(std::move(score));
  return out;
}

}  // namespace gradlane::sidecar
