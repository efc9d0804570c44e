// The Exporter (gradlane/metrics.hpp): prometheus-cpp's Exposer (civetweb) with the sources it
// serves, and the family builders.
#include <fmt/format.h>
#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <sstream>
#include <utility>

#include "gradlane/error.hpp"
#include "gradlane/metrics.hpp"

namespace gradlane::metrics {
namespace {

prometheus::ClientMetric labelled(const Labels& labels) {
  prometheus::ClientMetric m;
  for (const auto& [name, value] : labels) m.label.push_back({name, value});
  return m;
}

}  // namespace

struct Exporter::State {
  std::unique_ptr<prometheus::Exposer> exposer;
  mutable std::mutex mutex;  // sources: add() and text() may run on different threads
  // The exposer holds weak pointers: the sources live as long as the exporter.
  std::vector<std::shared_ptr<prometheus::Collectable>> sources;
};

Exporter::Exporter(const std::string& bind) : state_(std::make_unique<State>()) {
  const auto colon = bind.rfind(':');
  if (colon == std::string::npos || colon + 1 == bind.size() ||
      bind.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
    throw Error(
        Errc::invalid_argument,
        fmt::format("metrics address '{}' has no port: give ADDRESS:PORT, e.g. 0.0.0.0:9464 (port 0: any)", bind));
  }
  try {
    // One serving thread: a scrape is rare, and the program's own threads stay its own.
    state_->exposer = std::make_unique<prometheus::Exposer>(bind, 1);
  } catch (const std::exception& e) {
    throw Error(Errc::system, fmt::format("cannot serve metrics on {}: {} (is the port in use, or the address not "
                                          "one of this host's?)",
                                          bind, e.what()));
  }
}

Exporter::~Exporter() = default;

std::uint16_t Exporter::port() const {
  const auto ports = state_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : static_cast<std::uint16_t>(ports.front());
}

void Exporter::add(std::shared_ptr<prometheus::Collectable> source) {
  const std::lock_guard lock(state_->mutex);
  state_->exposer->RegisterCollectable(source);
  state_->sources.push_back(std::move(source));
}

std::string Exporter::text() const {
  std::vector<prometheus::MetricFamily> families;
  {
    const std::lock_guard lock(state_->mutex);
    for (const auto& source : state_->sources) {
      auto collected = source->Collect();
      std::move(collected.begin(), collected.end(), std::back_inserter(families));
    }
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  if (!std::is_sorted(bounds_.begin(), bounds_.end())) {
    throw Error(Errc::invalid_argument, "a histogram's upper bounds must be in increasing order");
  }
}

void Histogram::observe(double value) {
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[static_cast<std::size_t>(bucket)];
  ++count_;
  sum_ += value;
}

prometheus::ClientMetric Histogram::metric(const Labels& labels) const {
  auto m = labelled(labels);
  m.histogram.sample_count = count_;
  m.histogram.sample_sum = sum_;
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < counts_.size(); ++i) {
    cumulative += counts_[i];
    const double bound = i < bounds_.size() ? bounds_[i] : std::numeric_limits<double>::infinity();
    m.histogram.bucket.push_back({cumulative, bound});
  }
  return m;
}

prometheus::MetricFamily family(std::string name, std::string help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void add_counter(prometheus::MetricFamily& family, const Labels& labels, double value) {
  auto m = labelled(labels);
  m.counter.value = value;
  family.metric.push_back(std::move(m));
}

void add_gauge(prometheus::MetricFamily& family, const Labels& labels, double value) {
  auto m = labelled(labels);
  m.gauge.value = value;
  family.metric.push_back(std::move(m));
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace gradlane::metrics
