// The registered regions of a shard, as the server, the replica and the worker lay them out.
//
//   shard region (id 2)  [ShardHeader: 64 bytes][floats × n]   REMOTE_READ: workers pull it
//   slot ring (id 1)     [slot 0: n floats][slot 1] … [slot S-1]  REMOTE_WRITE: workers push
//                        into it; REMOTE_READ too, so a replica can re-read an update whose
//                        mirror write never came. Sequence s uses slot s % S.
//                        Windowed (ShardOptions::grant_windows): the ring's own key opens it
//                        for REMOTE_READ only, and each slot is also a region of its own that
//                        no key opens, for the memory window a grant binds over it.
//   snapshot (id 3)      [floats × n][velocity × n, with momentum]   REMOTE_READ: a copy of the
//                        model (and the momentum state) a server makes once when a replica
//                        joins it running; the replica reads it and lets go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradlane/connection.hpp"
#include "gradlane/memory.hpp"
#include "ps/protocol/model_version.hpp"

namespace gradlane::ps {

inline constexpr std::uint32_t kSlotRegionId = 1;
inline constexpr std::uint32_t kShardRegionId = 2;
inline constexpr std::uint32_t kSnapshotRegionId = 3;
inline constexpr std::size_t kHeaderBytes = sizeof(ShardHeader);

class ShardRegion {
 public:
  ShardRegion(const Device& device, std::size_t floats);
  ShardHeader& header() const { return *header_; }
  std::span<float> floats() const { return {reinterpret_cast<float*>(buffer_.data() + kHeaderBytes), count_}; }
  const MemoryRegion& region() const { return region_; }
  // The floats registered again, for the NIC to write locally: where a replica joining a
  // running server READs the server's snapshot. The shard's own region stays remote-read only.
  MemoryRegion register_floats_for_reads(const Device& device) const;

 private:
  Buffer buffer_;
  ShardHeader* header_;  // constructed in buffer_, which owns the bytes
  std::size_t count_;
  MemoryRegion region_;
};

class SlotRing {
 public:
  // Windowed: the ring's own key opens it for reading only, and every `slots_per_window`
  // consecutive slots are a region of their own that no key opens, for a memory window over
  // all of it (a slot at a server or replica; a worker's partition at an aggregator).
  SlotRing(const Device& device, std::size_t floats, std::uint32_t slots, bool windowed = false,
           std::uint32_t slots_per_window = 1);
  std::size_t slot_bytes() const { return floats_ * sizeof(float); }
  std::span<const float> slot(std::uint32_t index) const {
    return {reinterpret_cast<const float*>(buffer_.data() + index * slot_bytes()), floats_};
  }
  const MemoryRegion& region() const { return region_; }
  // Windowed: slots [index, index + 1) × slots_per_window as a region of its own
  // (Access::windows, no remote rights).
  const MemoryRegion& window_region(std::uint32_t index) const { return window_regions_.at(index); }

 private:
  Buffer buffer_;
  std::size_t floats_;
  MemoryRegion region_;
  std::vector<MemoryRegion> window_regions_;  // windowed only
};

// A server's copy of its model for a replica joining it running (kSnapshotRegionId): taken
// between applies, at a version the server names in its Adopted message.
class ModelSnapshot {
 public:
  // The model, then (with momentum) the velocity: what a joining replica needs to go on
  // applying exactly as the server does.
  ModelSnapshot(const Device& device, std::span<const float> model, std::span<const float> velocity = {});
  const MemoryRegion& region() const { return region_; }

 private:
  Buffer buffer_;
  MemoryRegion region_;
};

// connect(), retried while the peer's listener is not up yet or the peer does not answer
// (connection_rejected, unreachable), within `timeout`; on `shared` when given.
Connection connect_with_retry(const Device& device, const std::string& address, std::uint16_t port,
                              const TransportOptions& options, Millis timeout,
                              const std::optional<CompletionQueue>& shared = std::nullopt);

}  // namespace gradlane::ps
