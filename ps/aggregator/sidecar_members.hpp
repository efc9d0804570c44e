// The sidecar mode of a ps::Aggregator: the host's gradlaned forms the groups (include/gradlane/
// ps.hpp, "Aggregation (sidecar mode)"). Workers write redirected members into their own
// partition of the member ring; the sidecar's aggregate grant says which server sequence their
// sum becomes. The AggregateBook pairs the two; when an aggregate is due, its members are
// summed in a fixed order straight into the forward Worker's registered buffer and written
// from there, in the granted slot, to the server and the replica. Internal to the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gradlane/ps/aggregator.hpp"
#include "gradlane/sidecar.hpp"
#include "ps/aggregator/aggregate_book.hpp"
#include "ps/aggregator/member_peer.hpp"
#include "ps/aggregator/partition_pool.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::ps {

class SidecarMembers {
 public:
  // Attaches to the host's gradlaned (AggregatorOptions::sidecar).
  SidecarMembers(const AggregatorOptions& options, std::uint32_t slots);

  // Once: the ring, a partition per worker (and spares), and the workers of the start.
  void accept(Aggregator::State& s, std::size_t workers, Millis timeout);
  std::size_t progress(Aggregator::State& s);
  // Some worker came, none is left, and no member waits for its aggregate.
  bool finished(const Aggregator::State& s) const;
  // The partition of the late joiner LateJoins numbered `accepted` (Joined::accepted).
  std::uint32_t late_partition(std::size_t accepted) const;

 private:
  std::size_t take_doorbells(Aggregator::State& s);
  std::size_t take_grants(Aggregator::State& s);
  std::size_t forward_due(Aggregator::State& s);
  void forward_aggregate(Aggregator::State& s, const DueAggregate& due);
  // Partitions of workers gone whose member slots are all free, back to the pool.
  std::size_t reclaim_partitions(Aggregator::State& s);

  std::uint32_t slot_count_;  // member slots per partition (aggregate id % slots)
  sidecar::Client sidecar_;
  std::optional<SlotRing> ring_;  // allocated once the workers are known
  std::optional<AggregateBook> book_;
  // The ring's partitions (shared with the advertising callback LateJoins keeps), and the
  // number of the first late joiner's advertisement (Joined::accepted counts from it).
  std::shared_ptr<PartitionPool> partitions_;
  // grant_windows: the window over each partition, bound on the connection it was advertised
  // to (shared with the advertising callback too); dropped once the partition comes back.
  std::shared_ptr<std::vector<std::optional<MemoryWindow>>> partition_windows_;
  std::size_t first_late_advertised_ = 0;
};

}  // namespace gradlane::ps
