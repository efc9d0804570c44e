// ScheduleLog: the schedule a sidecar made, one JSON object per line — which update went
// when, in what order, with which sequence number, and what was dropped or sent to an
// aggregator. Slots are this host's CLOCK_MONOTONIC in nanoseconds. `gradlaned --schedule-log
// FILE` writes it; the softroce tests read it to check the schedule from the receiver's side.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "sidecar/core/outcome.hpp"

namespace gradlane::sidecar {

// `origin`: "here" for decisions this sidecar's scheduler made, "peer" for answers a peer's
// scheduler sent for this host's applications.
std::string decision_json(const sched::Outcome& outcome, sched::Instant now, std::string_view origin);

class ScheduleLog {
 public:
  // Appends to `path` ("-" = stderr). Throws Error(system) naming the path if it can't be opened.
  explicit ScheduleLog(const std::string& path);
  ScheduleLog(const ScheduleLog&) = delete;
  ScheduleLog& operator=(const ScheduleLog&) = delete;
  ~ScheduleLog();

  void decision(const sched::Outcome& outcome, sched::Instant now, std::string_view origin);
  void completion(sched::TransferId transfer, sched::Instant now, sched::Nanos measured, bool ok);

 private:
  std::FILE* file_ = nullptr;  // owned unless it is stderr
  bool owned_ = false;
};

}  // namespace gradlane::sidecar
