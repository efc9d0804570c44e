// PartitionPool: the partitions of a sidecar-mode aggregator's member ring, one per worker
// connection (each worker writes its members into its own partition, include/gradlane/ps.hpp,
// "Aggregation (sidecar mode)"). A partition goes to each connection as it is advertised to,
// and comes back once that connection's worker is gone and none of its member slots is still
// held by an aggregate (AggregateBook::holds_any). Without giving them back, a job whose workers
// reconnect (a restart, a superseded connection) ran out after workers + spare connections.
//
// Pure: no verbs, threads or clock reads. One owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace gradlane::ps {

class PartitionPool {
 public:
  explicit PartitionPool(std::uint32_t partitions);

  // The partition for the next connection advertised to (its number: advertised() before the
  // call), or nullopt when every partition is out.
  std::optional<std::uint32_t> take();
  // Back once its connection's worker is gone and its slots are free; the partitions given back
  // longest ago are handed out first. Error(invalid_argument) for one that is not out.
  void give_back(std::uint32_t partition);
  // The partition the connection advertised to as number `advertised` (0-based) took.
  // Error(invalid_argument) for a number never advertised or one that found none free.
  std::uint32_t partition_of(std::size_t advertised) const;

  std::size_t advertised() const noexcept { return by_advertised_.size(); }
  std::size_t free() const noexcept { return free_.size(); }

 private:
  std::deque<std::uint32_t> free_;
  std::vector<bool> out_;
  std::vector<std::optional<std::uint32_t>> by_advertised_;
};

}  // namespace gradlane::ps
