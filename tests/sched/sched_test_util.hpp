// Small helpers shared by the scheduling-core tests: time literals, request builders and
// outcome filters. Nothing here has behaviour the tests rely on beyond what it says.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "sidecar/core/outcome.hpp"
#include "sidecar/core/scheduler.hpp"
#include "sidecar/core/types.hpp"

namespace gradlane::sched::testing {

constexpr Instant at_ns(std::int64_t ns) { return Instant{Nanos{ns}}; }
constexpr Instant at_us(std::int64_t us) { return Instant{Nanos{us * 1000}}; }
constexpr Nanos us(std::int64_t n) { return Nanos{n * 1000}; }

constexpr EndpointId ep(std::uint32_t n) { return EndpointId{n}; }
constexpr double kGBps = 1e9;  // bytes per second in one GB/s
constexpr Bytes kMB = 1'000'000;
constexpr Bytes kMiB = Bytes{1} << 20;

// A request from worker `sender` to server `receiver`; everything else defaulted.
inline Request request(std::uint64_t id, std::uint32_t sender, std::uint32_t receiver, Bytes bytes,
                       Version computed_on = 0) {
  Request r;
  r.id = RequestId{id};
  r.job = JobId{1};
  r.sender = EndpointId{sender};
  r.receiver = EndpointId{receiver};
  r.tensor = TensorId{1};
  r.bytes = bytes;
  r.computed_on = computed_on;
  return r;
}

template <class T>
std::vector<T> only(const std::vector<Outcome>& outcomes) {
  std::vector<T> v;
  for (const Outcome& o : outcomes) {
    if (const T* t = std::get_if<T>(&o)) v.push_back(*t);
  }
  return v;
}

// Request ids of the grants, in grant order.
inline std::vector<std::uint64_t> granted_ids(const std::vector<Outcome>& outcomes) {
  std::vector<std::uint64_t> ids;
  for (const Grant& g : only<Grant>(outcomes)) ids.push_back(to_int(g.request));
  return ids;
}

// A config with everything that is not under test switched off or out of the way.
// A BandwidthConfig with these three fields and the other defaults.
inline BandwidthConfig bandwidth_config(double default_rate, double ewma_weight, double floor) {
  BandwidthConfig c;
  c.default_bytes_per_sec = default_rate;
  c.ewma_weight = ewma_weight;
  c.min_bytes_per_sec = floor;
  return c;
}

inline SchedulerConfig plain_config() {
  SchedulerConfig c;
  c.staleness_bound = std::nullopt;
  c.replica_bound = std::nullopt;
  c.credit_bytes = Bytes{1} << 40;
  c.grant_horizon = Nanos{1'000'000'000};  // 1 s: everything pending is decided in one pass
  c.tenant_floor_share = 0.0;
  return c;
}

}  // namespace gradlane::sched::testing
