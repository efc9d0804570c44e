// A role's Prometheus metrics (--metrics ADDRESS:PORT): served while the role runs and, at its
// end, written once more to <out>/<name>.metrics.prom — what a scrape then returns, beside the
// role's stats.json — since the process is gone before anyone scrapes it again.
#pragma once

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "gradlane/metrics.hpp"

namespace gradlane::trainer {

template <typename Source>
class RoleMetrics {
 public:
  // No exporter and no file when `address` is empty; `source` then only counts.
  RoleMetrics(const std::string& address, std::string file, std::shared_ptr<Source> source)
      : source_(std::move(source)), file_(std::move(file)) {
    if (address.empty()) return;
    exporter_.emplace(address);
    exporter_->add(source_);
    std::printf("metrics on port %u\n", static_cast<unsigned>(exporter_->port()));
    std::fflush(stdout);
  }
  Source& operator*() const { return *source_; }
  Source* operator->() const { return source_.get(); }
  explicit operator bool() const { return exporter_.has_value(); }

  void write_final() const {
    if (exporter_) std::ofstream(file_) << exporter_->text();
  }

 private:
  std::shared_ptr<Source> source_;
  std::string file_;
  std::optional<metrics::Exporter> exporter_;
};

}  // namespace gradlane::trainer
