// Tensor partitioning (ByteScheduler / P3).
//
// Why partition: a large tensor, once on the wire, blocks every tensor queued behind it, even
// ones the next forward pass needs sooner. Cutting it into parts of about `target` bytes lets a
// higher-priority part overtake at part boundaries, and bounds how long one transfer holds a
// server's ingress. ByteScheduler found ~4 MB a good starting point on 10-100 Gb/s links: big
// enough that per-transfer overhead (a doorbell, a grant) is noise, small enough to preempt.
//
// Parts are near-equal rather than `target`-sized plus a runt: a 9 MiB tensor becomes three
// 3 MiB parts, not 4+4+1, because a tiny last part still costs a full slot and a sequence
// number. Part boundaries are multiples of `align` (cache lines for the Eigen sums at the
// aggregator and server). The split depends only on (bytes, target, align), so every worker
// cuts the same tensor identically and aggregators can sum part i of several workers.
#pragma once

#include <cstdint>
#include <vector>

#include "sidecar/core/types.hpp"

namespace gradlane::sched {

struct Partition {
  std::uint32_t index = 0;
  std::uint32_t count = 0;
  Bytes offset = 0;
  Bytes length = 0;
  friend constexpr bool operator==(const Partition&, const Partition&) = default;
};

class Partitioner {
 public:
  static constexpr Bytes kDefaultTarget = Bytes{4} << 20;  // 4 MiB
  static constexpr Bytes kDefaultAlign = 64;
  // A tensor is cut into at most this many parts; past it, parts grow beyond the target. Each
  // part costs a slot, a sequence number and an outcome, so this bounds what one request can
  // cost a sidecar, and a peer's answer splitting a request into more parts is refused.
  static constexpr std::uint32_t kMaxParts = 65'536;

  // Precondition: align >= 1 and target >= align (SchedulerConfig::validate checks it).
  explicit Partitioner(Bytes target = kDefaultTarget, Bytes align = kDefaultAlign) noexcept
      : target_(target), align_(align) {}

  // Number of parts for a tensor of `bytes` (>= 1 for bytes >= 1, <= kMaxParts).
  std::uint32_t count(Bytes bytes) const noexcept;
  // Part `index` of a tensor of `bytes`. Precondition: index < count(bytes).
  Partition part(Bytes bytes, std::uint32_t index) const noexcept;
  std::vector<Partition> split(Bytes bytes) const;

  Bytes target() const noexcept { return target_; }
  Bytes align() const noexcept { return align_; }

 private:
  Bytes chunk(Bytes bytes) const noexcept;  // length of every part but possibly the last

  Bytes target_;
  Bytes align_;
};

}  // namespace gradlane::sched
