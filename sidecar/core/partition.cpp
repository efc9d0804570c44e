#include "sidecar/core/partition.hpp"

#include <algorithm>

namespace gradlane::sched {
namespace {

constexpr Bytes ceil_div(Bytes a, Bytes b) noexcept { return (a + b - 1) / b; }

}  // namespace

Bytes Partitioner::chunk(Bytes bytes) const noexcept {
  if (bytes <= target_) return bytes;
  const Bytes wanted_parts = std::min<Bytes>(ceil_div(bytes, target_), kMaxParts);
  // Near-equal parts, each rounded up to the alignment; rounding can only reduce the count.
  return ceil_div(ceil_div(bytes, wanted_parts), align_) * align_;
}

std::uint32_t Partitioner::count(Bytes bytes) const noexcept {
  if (bytes == 0) return 0;
  return static_cast<std::uint32_t>(ceil_div(bytes, chunk(bytes)));
}

Partition Partitioner::part(Bytes bytes, std::uint32_t index) const noexcept {
  const Bytes size = chunk(bytes);
  const Bytes offset = Bytes{index} * size;
  return Partition{index, count(bytes), offset, std::min(size, bytes - offset)};
}

std::vector<Partition> Partitioner::split(Bytes bytes) const {
  std::vector<Partition> parts;
  const std::uint32_t n = count(bytes);
  parts.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) parts.push_back(part(bytes, i));
  return parts;
}

}  // namespace gradlane::sched
