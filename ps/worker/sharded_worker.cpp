// ShardedWorker: a model's tensors over S shard servers (include/gradlane/ps.hpp).
#include <fmt/format.h>

#include "gradlane/ps/sharded.hpp"

namespace gradlane::ps {

ShardedWorker::ShardedWorker(const Device& device, std::span<const std::size_t> tensor_floats,
                             std::vector<WorkerOptions> shards) {
  if (shards.empty()) throw Error(Errc::invalid_argument, "ShardedWorker: no shard servers");
  const auto servers = static_cast<std::uint32_t>(shards.size());
  placement_ = place_tensors(tensor_floats, servers);
  const std::vector<std::size_t> floats = shard_floats(placement_, servers);
  workers_.reserve(servers);
  for (std::uint32_t s = 0; s < servers; ++s) {
    if (floats[s] == 0) {
      throw Error(Errc::invalid_argument, fmt::format("ShardedWorker: {} servers for {} tensors leaves server {} empty",
                                                      servers, tensor_floats.size(), s));
    }
    shards[s].floats = floats[s];
    workers_.emplace_back(device, shards[s]);
  }
}

const TensorPlacement& ShardedWorker::at(std::size_t tensor) const {
  if (tensor >= placement_.size()) {
    throw Error(Errc::invalid_argument,
                fmt::format("tensor {} does not exist (the model has {} tensors)", tensor, placement_.size()));
  }
  return placement_[tensor];
}

std::span<float> ShardedWorker::gradient(std::size_t tensor) {
  const TensorPlacement& p = at(tensor);
  return workers_[p.server].gradient().subspan(p.offset, p.floats);
}

std::span<const float> ShardedWorker::model(std::size_t tensor) const {
  const TensorPlacement& p = at(tensor);
  return workers_[p.server].model().subspan(p.offset, p.floats);
}

std::vector<PushResult> ShardedWorker::push(std::span<const std::uint64_t> computed_on, std::uint64_t tag) {
  if (computed_on.size() != workers_.size()) {
    throw Error(Errc::invalid_argument,
                fmt::format("push: {} versions for {} shards", computed_on.size(), workers_.size()));
  }
  for (std::size_t s = 0; s < workers_.size(); ++s) workers_[s].start_push(computed_on[s], tag);
  std::vector<PushResult> results;
  results.reserve(workers_.size());
  for (Worker& w : workers_) results.push_back(w.wait_push());
  return results;
}

std::vector<PullResult> ShardedWorker::pull() {
  std::vector<PullResult> results;
  results.reserve(workers_.size());
  for (Worker& w : workers_) results.push_back(w.pull());
  return results;
}

}  // namespace gradlane::ps
