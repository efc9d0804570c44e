// gradlaned's metrics (gradlane/metrics.hpp): the daemon's counters and its ScheduleRecord,
// copied by update() on the daemon's loop and served at each scrape as of that copy.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "gradlane/metrics.hpp"
#include "sidecar/daemon/daemon.hpp"
#include "sidecar/daemon/schedule_record.hpp"

namespace gradlane::sidecar {

class DaemonMetrics final : public prometheus::Collectable {
 public:
  void update(const Daemon& daemon);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable std::mutex mutex_;
  DaemonStats stats_;
  ScheduleRecord record_;
  std::size_t apps_ = 0;
};

}  // namespace gradlane::sidecar
