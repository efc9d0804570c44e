// gradlane::sched — the value types of the scheduling core.
//
// The core is a pure library: no verbs, no threads, and no clock reads. Every entry point takes
// `now` as an argument, so the simulator, the property tests and the daemon drive the very same
// code and the same inputs always produce the same outputs.
//
// Ids are distinct enum types (not bare integers) so a worker id can never be passed where a
// job or tensor id is expected; `to_int()` gives the number back for logs and wire formats.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <type_traits>

namespace gradlane::sched {

// The scheduler's own timeline. It deliberately has no now(): time enters only as an argument.
// The daemon feeds readings of its CLOCK_MONOTONIC (steady_clock::now().time_since_epoch());
// slot times it gets back are on that same local timeline (see scheduler.hpp). There is no
// shared clock across hosts, so an Instant never leaves the host that produced it: a peer is
// told durations relative to the moment of the message, never instants.
struct Timeline {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<Timeline>;
  static constexpr bool is_steady = true;
};
using Nanos = std::chrono::nanoseconds;
using Instant = std::chrono::time_point<Timeline, Nanos>;

using Bytes = std::uint64_t;
// Server model version: how many updates the server has applied (see staleness.hpp).
using Version = std::uint64_t;
// Sequence number of an applied update at one server; version after applying seq s is s.
using Seq = std::uint64_t;
// A receiver's grant key (gradlane::sidecar::GrantKey), opaque to the core: the layers that
// route grants stamp them with tokens of it (Grant::token).
using GrantKey = std::array<std::uint8_t, 16>;

enum class RequestId : std::uint64_t {};
enum class JobId : std::uint32_t {};       // a training job = a tenant of the sidecar
enum class EndpointId : std::uint32_t {};  // a host NIC: worker, server, aggregator or replica
enum class TensorId : std::uint32_t {};
enum class TransferId : std::uint64_t {};  // names one granted transfer, for complete()
enum class AggregateId : std::uint64_t {};

template <class Id>
requires std::is_enum_v<Id>
constexpr std::underlying_type_t<Id> to_int(Id id) noexcept { return static_cast<std::underlying_type_t<Id>>(id); }

// A half-open interval [start, end) on one NIC's timeline.
struct Slot {
  Instant start{};
  Instant end{};

  constexpr Nanos length() const noexcept { return end - start; }
  constexpr bool overlaps(const Slot& other) const noexcept { return start < other.end && other.start < end; }
  friend constexpr bool operator==(const Slot&, const Slot&) = default;
};

// What an application asks for: "may I send this gradient of `bytes` to `receiver`?"
struct Request {
  RequestId id{};
  JobId job{};
  EndpointId sender{};    // the worker's NIC (its egress carries the bytes)
  EndpointId receiver{};  // the server holding the shard (its ingress receives them)
  TensorId tensor{};
  Bytes bytes = 0;
  Version computed_on = 0;     // server version the gradient was computed on (the pulled model)
  double gradient_norm = 0.0;  // carried for telemetry; secondary tie-break (see scheduler.hpp)
  std::uint32_t priority = 0;  // lower = earlier layer = needed first by the next forward pass
  // What the job still has to send, this update included, as the application knows it (its
  // remaining steps × update bytes × workers); 0 = not declared. Between jobs on one NIC the
  // one with the least remaining work goes first (tenant_arbiter.hpp).
  Bytes job_remaining = 0;
  // The sender cannot reach an aggregator (it has none, or lost it): never redirect this one.
  bool direct_only = false;
};

// One part of a partitioned request: bytes [offset, offset + length) of the tensor.
struct PartRef {
  RequestId request{};
  std::uint32_t index = 0;
  friend constexpr bool operator==(const PartRef&, const PartRef&) = default;
};

}  // namespace gradlane::sched
