// SchedulerConfig: every knob of the scheduling core, declared once with its default and why.
// The daemon fills it from its flags/environment; validate() names the first bad field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sidecar/core/aggregation.hpp"
#include "sidecar/core/bandwidth.hpp"
#include "sidecar/core/tenant_arbiter.hpp"
#include "sidecar/core/types.hpp"

namespace gradlane::sched {

enum class Ordering : std::uint8_t {
  // MLfabric: among the transfers that could go next, the one that would finish first
  // (network-aware shortest job first), with staleness drops and aggregation.
  mlfabric,
  // Arrival order (lowest request id first), no aggregation: the baseline parameter server.
  fifo,
};

// How a server's ingress is shared by the transfers granted to it.
enum class IngressSharing : std::uint8_t {
  // One transfer at a time (SlotBook), each at the path's rate, as the design brief asks. A
  // server whose NIC is k times faster than a sender's idles (k-1)/k of it for that slot.
  exclusive,
  // Concurrent transfers, each booked at the share of the line rate its path can use
  // (ingress_shares.hpp): the line rate is packed, and a waiting transfer whose share is free
  // starts at once, so one slow sender never idles the rest of the receiver.
  packed,
};

struct SchedulerConfig {
  Ordering ordering = Ordering::mlfabric;
  IngressSharing ingress = IngressSharing::exclusive;

  // tau: the largest delay an applied update may have (staleness.hpp); nullopt = unbounded.
  // Set it from the job: with n asynchronous workers the natural delay is about n updates per
  // round, and the point of the bound is to cut the tail a straggler would add to it.
  std::optional<std::uint32_t> staleness_bound = 64;

  // B: how far sequence numbers may run ahead of the replica's acknowledgement;
  // nullopt = the server has no replica. 64 keeps a failover's loss to 64 updates while
  // leaving room for the replica's acks to arrive a few round trips late.
  std::optional<std::uint64_t> replica_bound = 64;

  // Whether a server's writers (workers, aggregators) write each update to its replica too, at
  // the same time (ps::Worker's default; not when the replica READs updates from the server).
  // Such a writer's egress carries the update twice: its slot is sized for 2x the bytes on
  // its side, and its measured transfers are taken as 2x on that side. Only for servers with
  // a replica (replica_bound). Off by default: the simulator models no replica traffic.
  bool writers_mirror = false;

  // ByteScheduler's starting point: ~4 MiB parts (partition.hpp), boundaries on cache lines.
  Bytes partition_bytes = Bytes{4} << 20;
  Bytes partition_align = 64;

  // Credit: bytes a NIC may have granted and not yet completed (ByteScheduler/P3). Two parts:
  // one on the wire and the next one granted, so the NIC never idles between parts, while a
  // newly arrived high-priority tensor waits behind at most one part.
  Bytes credit_bytes = Bytes{8} << 20;

  // Share of a host NIC each backlogged job is guaranteed despite shortest-remaining-job-first
  // (tenant_arbiter.hpp). 10%: up to ten co-located jobs can all be guaranteed progress.
  double tenant_floor_share = 0.10;

  // How a host NIC is shared between jobs: gradlane's shortest remaining job first (with the
  // floor above), or a baseline to compare it with: per-job fair sharing, or strict priority in
  // job_priority's order (the first listed is served first; unlisted jobs after, lower id first).
  JobSharing job_sharing = JobSharing::shortest_remaining;
  std::vector<JobId> job_priority;

  // Only slots starting within this much of `now` are granted; the rest wait for a later
  // schedule() call. Granting far ahead fixes the order before shorter jobs that arrive
  // meanwhile could be placed in front (SJF needs to see them), and grants updates one by one
  // that could have been summed had they waited together (aggregation needs a queue). Too
  // short, and the grant reaches the sender after its slot began. 200 us: many control-message
  // round trips, and about half a 4 MiB part at 100 Gb/s. perf/sched's simulator shows fewer
  // aggregates and more drops under load with 1 ms.
  Nanos grant_horizon{200'000};

  AggregationConfig aggregation{};
  BandwidthConfig bandwidth{};

  // For tests: every decision the indexed scan makes is made again by a scan of every
  // candidate, and a difference throws std::logic_error. O(pending) per decision.
  bool check_scan = false;

  // A message naming the first invalid field, or nullopt if the configuration is usable.
  std::optional<std::string> validate() const;
};

}  // namespace gradlane::sched
