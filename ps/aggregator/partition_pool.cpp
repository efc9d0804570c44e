#include "ps/aggregator/partition_pool.hpp"

#include <fmt/format.h>

#include "gradlane/error.hpp"

namespace gradlane::ps {

PartitionPool::PartitionPool(std::uint32_t partitions) : out_(partitions, false) {
  for (std::uint32_t p = 0; p < partitions; ++p) free_.push_back(p);
}

std::optional<std::uint32_t> PartitionPool::take() {
  std::optional<std::uint32_t> partition;
  if (!free_.empty()) {
    partition = free_.front();
    free_.pop_front();
    out_[*partition] = true;
  }
  by_advertised_.push_back(partition);
  return partition;
}

void PartitionPool::give_back(std::uint32_t partition) {
  if (partition >= out_.size() || !out_[partition]) {
    throw Error(Errc::invalid_argument, fmt::format("PartitionPool: partition {} is not out", partition));
  }
  out_[partition] = false;
  free_.push_back(partition);
}

std::uint32_t PartitionPool::partition_of(std::size_t advertised) const {
  if (advertised >= by_advertised_.size() || !by_advertised_[advertised]) {
    throw Error(Errc::invalid_argument,
                fmt::format("PartitionPool: connection {} was not given a partition", advertised));
  }
  return *by_advertised_[advertised];
}

}  // namespace gradlane::ps
