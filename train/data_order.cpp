#include "train/data_order.hpp"

#include <algorithm>

namespace gradlane::train {

DataOrder::DataOrder(std::size_t rows, std::size_t batch, std::uint64_t seed, std::uint32_t shard_workers)
    : rows_(rows) {
  if (shard_workers == 0 || batch == 0 || batch > rows) {  // the sampler refuses the bad cases
    global_.emplace(rows, batch, seed);
    return;
  }
  const std::size_t count = std::min<std::size_t>(shard_workers, rows / batch);
  const std::size_t size = rows / count;
  shards_.reserve(count);
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t length = k + 1 == count ? rows - k * size : size;
    // Distinct, deterministic streams per shard (the golden-ratio increment spreads the seeds).
    shards_.push_back(Shard{static_cast<std::uint32_t>(k * size),
                            BatchSampler(length, batch, seed + (k + 1) * 0x9e3779b97f4a7c15ULL)});
  }
}

std::pair<std::uint32_t, std::uint32_t> DataOrder::rows_of(std::uint32_t worker) const {
  if (shards_.empty()) return {0, static_cast<std::uint32_t>(rows_)};
  const std::size_t k = worker % shards_.size();
  const std::uint32_t first = shards_[k].first;
  const std::uint32_t last = k + 1 == shards_.size() ? static_cast<std::uint32_t>(rows_) : shards_[k + 1].first;
  return {first, last};
}

std::span<const std::uint32_t> DataOrder::next(std::uint32_t worker) {
  if (global_) return global_->next();
  Shard& shard = shards_[worker % shards_.size()];
  const std::span<const std::uint32_t> local = shard.sampler.next();
  batch_rows_.resize(local.size());
  std::transform(local.begin(), local.end(), batch_rows_.begin(), [&](std::uint32_t r) { return r + shard.first; });
  return batch_rows_;
}

}  // namespace gradlane::train
