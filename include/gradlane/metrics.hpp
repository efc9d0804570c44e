// Prometheus metrics for gradlane's programs (gradlaned, the parameter server's roles, the
// trainer): an Exporter serves GET /metrics in Prometheus' text format from a thread of its
// own, built at each scrape from the Collectables added to it. A program's counters live where
// they are counted (DaemonStats, ServerStats, ...), read only by the thread that owns them; its
// Collectable copies them under a lock when that thread calls update(), so a scrape never
// touches the data path and shows the values of the last update().
//
// A separate library (gradlane::metrics, prometheus-cpp), not part of libgradlane.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gradlane::metrics {

using Labels = std::map<std::string, std::string>;

class Exporter {
 public:
  // Listens on `bind` ("ADDRESS:PORT"; port 0 takes a free one, see port()). Throws
  // Error(invalid_argument) for an address without a port and Error(system) when it cannot
  // listen there (in use, not an address of this host), naming the address.
  explicit Exporter(const std::string& bind);
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;
  ~Exporter();

  std::uint16_t port() const;
  // Serves what `source` collects at every scrape from now on; the exporter keeps it alive.
  void add(std::shared_ptr<prometheus::Collectable> source);
  // What a scrape returns now (the same text; for a program's final summary file).
  std::string text() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A histogram over fixed upper bounds (+Inf is implied), filled by its owner's thread and
// copied out under its owner's lock.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  std::uint64_t count() const noexcept { return count_; }
  double sum() const noexcept { return sum_; }
  prometheus::ClientMetric metric(const Labels& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // per bucket, not cumulative; one more for +Inf
  std::uint64_t count_ = 0;
  double sum_ = 0.0;
};

// Families of values a program counts itself: add one sample per label set.
prometheus::MetricFamily family(std::string name, std::string help, prometheus::MetricType type);
void add_counter(prometheus::MetricFamily& family, const Labels& labels, double value);
void add_gauge(prometheus::MetricFamily& family, const Labels& labels, double value);

// The median of `values` (0 for none): what a straggler score divides by — the typical peer,
// which one slow peer cannot move the way it moves a mean.
double median(std::vector<double> values);

}  // namespace gradlane::metrics
