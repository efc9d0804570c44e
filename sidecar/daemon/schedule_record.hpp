// What a daemon decided and how long its apps' pushes took, counted on the daemon's loop for
// its metrics (daemon_metrics.hpp): outcomes by kind, drops by reason, bytes granted, the
// staleness each grant will be applied at, and per sender endpoint the time from a push's
// submission to its last part settled (granted and written, or dropped).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>

#include "gradlane/metrics.hpp"
#include "sidecar/core/outcome.hpp"
#include "sidecar/core/types.hpp"

namespace gradlane::sidecar {

struct OutcomeCounts {
  std::uint64_t grants = 0;                                // parts sent straight to their server
  std::uint64_t redirects = 0;                             // parts sent to an aggregator
  std::uint64_t aggregates = 0;                            // aggregates granted a server slot
  std::uint64_t cancels = 0;                               // granted sequences whose transfer failed
  std::array<std::uint64_t, sched::kDropReasons> drops{};  // by sched::DropReason
  std::uint64_t granted_bytes = 0;                         // of grants, redirects and aggregates
};

class ScheduleRecord {
 public:
  // Senders are apps' declared endpoints: past this many, the rest share the `kOtherSenders`
  // histogram, so attaching under ever new endpoints cannot grow the record without bound.
  static constexpr std::size_t kMaxSenders = 1024;
  static constexpr std::uint32_t kOtherSenders = 0xFFFFFFFF;

  ScheduleRecord();
  void decided(const sched::Outcome& outcome);
  // A push of `sender` settled `took` after its submission (counted under kOtherSenders once
  // kMaxSenders others are known).
  void settled(std::uint32_t sender, sched::Nanos took);

  const OutcomeCounts& counts() const noexcept { return counts_; }
  const metrics::Histogram& staleness() const noexcept { return staleness_; }
  const std::map<std::uint32_t, metrics::Histogram>& push_seconds() const noexcept { return push_seconds_; }

 private:
  OutcomeCounts counts_;
  metrics::Histogram staleness_;
  std::map<std::uint32_t, metrics::Histogram> push_seconds_;  // by sender endpoint
};

}  // namespace gradlane::sidecar
