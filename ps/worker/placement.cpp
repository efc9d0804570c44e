// BytePS-style placement of a model's tensors on S shard servers (include/gradlane/ps.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "gradlane/ps/sharded.hpp"

namespace gradlane::ps {

std::vector<TensorPlacement> place_tensors(std::span<const std::size_t> tensor_floats, std::uint32_t servers) {
  if (servers == 0) throw Error(Errc::invalid_argument, "place_tensors: at least one server");
  for (std::size_t t = 0; t < tensor_floats.size(); ++t) {
    if (tensor_floats[t] == 0) throw Error(Errc::invalid_argument, fmt::format("place_tensors: tensor {} is empty", t));
  }
  // Largest first, each onto the least loaded server (ties: the lowest index), so the largest
  // shard exceeds the mean by at most one tensor.
  std::vector<std::size_t> order(tensor_floats.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return tensor_floats[a] > tensor_floats[b]; });
  std::vector<std::size_t> load(servers, 0);
  std::vector<TensorPlacement> placement(tensor_floats.size());
  for (const std::size_t t : order) {
    const auto server = static_cast<std::uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
    placement[t] = {server, 0, tensor_floats[t]};
    load[server] += tensor_floats[t];
  }
  // Within a shard, tensors keep the model's order: offsets follow from it.
  std::fill(load.begin(), load.end(), 0);
  for (TensorPlacement& p : placement) {
    p.offset = load[p.server];
    load[p.server] += p.floats;
  }
  return placement;
}

std::vector<std::size_t> shard_floats(std::span<const TensorPlacement> placement, std::uint32_t servers) {
  std::vector<std::size_t> floats(servers, 0);
  for (const TensorPlacement& p : placement) {
    if (p.server >= servers) {
      throw Error(Errc::invalid_argument,
                  fmt::format("shard_floats: a tensor is placed on server {} of {}", p.server, servers));
    }
    floats[p.server] = std::max(floats[p.server], p.offset + p.floats);
  }
  return floats;
}

}  // namespace gradlane::ps
