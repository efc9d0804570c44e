// ScheduleLog: the schedule a sidecar made, one JSON object per line — which update went
// when, in what order, with which sequence number, and what was dropped or sent to an
// aggregator. Slots are this host's CLOCK_MONOTONIC in nanoseconds. `gradlaned --schedule-log
// FILE` writes it (FILE is truncated when gradlaned starts: one run per file); the softroce
// tests read it to check the schedule from the receiver's side.
//
// A "request" line is an application's push as this sidecar accepted it (its "request" id is
// the one its decisions carry); an "applied" line says a receiver here applied every sequence
// through "seq" (its server's acknowledgement, its replica's included). Together: each
// update's request, grant, write and apply (python3 -m gradlane.timeline draws them).
//
// A decision line ("kind": go / redirect / aggregate) carries the planned slot and its
// "transfer" id. A transfer that ends early gives the rest of its slot back and a later
// grant may start there, so planned slots alone can overlap; the "completion" line of the
// same transfer says how much of its slot it used ([slot_start, used_end): up to the
// completion if it finished early, the whole slot if it failed, see sched::used_slot). A
// receiver's timeline — each planned slot cut at its used_end — never overlaps.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "sidecar/core/outcome.hpp"
#include "sidecar/core/scheduler.hpp"

namespace gradlane::sidecar {

// `origin`: "here" for decisions this sidecar's scheduler made, "peer" for answers a peer's
// scheduler sent for this host's applications.
std::string decision_json(const sched::Outcome& outcome, sched::Instant now, std::string_view origin);
// The completion of a transfer this sidecar's scheduler granted, as it was granted.
std::string completion_json(sched::TransferId transfer, const sched::TransferView& granted, sched::Instant now,
                            sched::Nanos measured, sched::TransferResult result);

std::string request_json(const sched::Request& request, sched::Instant now);
std::string applied_json(sched::EndpointId receiver, sched::Seq through, sched::Instant now);

class ScheduleLog {
 public:
  // Truncates `path` and writes to it ("-" = stderr): a file holds one run's schedule, so a
  // reader never mixes two runs' clocks and sequence numbers. Only a regular file of its own
  // is taken: a symbolic link, a hard link or a FIFO is refused (gradlaned runs as root: one
  // planted in a shared directory must make it neither overwrite another file nor block).
  // Throws Error(system) naming the path and why if it can't be opened.
  explicit ScheduleLog(const std::string& path);
  ScheduleLog(const ScheduleLog&) = delete;
  ScheduleLog& operator=(const ScheduleLog&) = delete;
  ~ScheduleLog();

  // A line that cannot be written (disk full, a closed pipe) is counted and said on stderr once
  // per file opened; it never throws: the schedule matters more than its log.
  void decision(const sched::Outcome& outcome, sched::Instant now, std::string_view origin);
  void completion(sched::TransferId transfer, const sched::TransferView& granted, sched::Instant now,
                  sched::Nanos measured, sched::TransferResult result);
  void request(const sched::Request& request, sched::Instant now);
  void applied(sched::EndpointId receiver, sched::Seq through, sched::Instant now);
  // Opens `path` again, appending (SIGHUP, after logrotate moved the file away). If that
  // fails the old file is kept and the failure returned as a message.
  std::optional<std::string> reopen();
  std::uint64_t failed_writes() const noexcept { return failed_writes_; }

 private:
  void write_line(const std::string& json) noexcept;

  std::string path_;
  std::FILE* file_ = nullptr;  // owned unless it is stderr
  bool owned_ = false;
  std::uint64_t failed_writes_ = 0;
  bool failure_said_ = false;  // the first failure since the file was opened was said
};

}  // namespace gradlane::sidecar
