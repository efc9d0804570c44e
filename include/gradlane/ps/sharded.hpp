// gradlane — a model's tensors over S shard servers: the placement and ps::ShardedWorker.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradlane/device.hpp"
#include "gradlane/ps/worker.hpp"

namespace gradlane::ps {

// Where a tensor lives: on shard server `server`, floats [offset, offset + floats) of its shard.
struct TensorPlacement {
  std::uint32_t server = 0;
  std::size_t offset = 0;
  std::size_t floats = 0;
};

// BytePS-style placement by size: tensors, largest first, each onto the server with the fewest
// floats so far (ties: the lowest index); within a shard, tensors keep the model's order.
// Deterministic, so servers and workers compute the same placement independently.
std::vector<TensorPlacement> place_tensors(std::span<const std::size_t> tensor_floats, std::uint32_t servers);
// Each server's shard size under `placement`.
std::vector<std::size_t> shard_floats(std::span<const TensorPlacement> placement, std::uint32_t servers);

// A worker of a sharded model: one Worker per shard server (each with its own sequence and
// replica), and each tensor a view into its shard's registered buffers. push() overlaps the
// shards: every request goes out first, then each shard's write as its grant comes.
class ShardedWorker {
 public:
  // shards[s] are the options for server s (its address, replica, sidecar); their `floats` are
  // set here from the placement. Throws Error(invalid_argument) if shards.size() != servers.
  ShardedWorker(const Device& device, std::span<const std::size_t> tensor_floats, std::vector<WorkerOptions> shards);

  std::size_t tensors() const { return placement_.size(); }
  // Throw Error(invalid_argument) for a tensor that does not exist.
  std::span<float> gradient(std::size_t tensor);
  std::span<const float> model(std::size_t tensor) const;
  const std::vector<TensorPlacement>& placement() const { return placement_; }
  Worker& shard(std::uint32_t server) { return workers_.at(server); }

  // Pushes every shard's gradient; computed_on[s] is the version of shard s it was computed on.
  std::vector<PushResult> push(std::span<const std::uint64_t> computed_on, std::uint64_t tag = 0);
  // Pulls every shard; result[s] is shard s's version.
  std::vector<PullResult> pull();

 private:
  const TensorPlacement& at(std::size_t tensor) const;
  std::vector<TensorPlacement> placement_;
  std::vector<Worker> workers_;
};

}  // namespace gradlane::ps
