// Which training rows each worker's next gradient is computed on: one order for the whole run,
// or each worker its own shard. Shared by the RDMA trainer (trainer/) and the simulator.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "train/model.hpp"

namespace gradlane::train {

// Which training rows each gradient is computed on. Global (shard_workers 0): one sampler,
// consumed in the order gradients are applied, whoever computed them. Sharded (shard_workers
// N): the rows split into K = min(N, rows / batch) contiguous shards of rows / K (the last takes
// the remainder) — K < N only when a shard would be smaller than a batch — and worker w draws
// only from shard w mod K, through that shard's own sampler (seeded by seed and shard).
class DataOrder {
 public:
  DataOrder(std::size_t rows, std::size_t batch, std::uint64_t seed, std::uint32_t shard_workers = 0);
  // The rows of the next gradient computed by `worker`.
  std::span<const std::uint32_t> next(std::uint32_t worker);
  std::size_t shards() const { return shards_.size(); }  // 0: global
  // The rows [first, last) `worker` draws from (all of them when global).
  std::pair<std::uint32_t, std::uint32_t> rows_of(std::uint32_t worker) const;

 private:
  struct Shard {
    std::uint32_t first = 0;
    BatchSampler sampler;  // over [0, shard size): offset by first
  };
  std::size_t rows_;
  std::optional<BatchSampler> global_;
  std::vector<Shard> shards_;
  std::vector<std::uint32_t> batch_rows_;
};

}  // namespace gradlane::train
