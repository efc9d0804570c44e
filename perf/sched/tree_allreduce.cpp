#include "perf/sched/tree_allreduce.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace gradlane::sched::sim {
namespace {

constexpr std::size_t kMaxChunks = 4096;

std::size_t children_of(std::size_t parent, std::size_t n) {
  return static_cast<std::size_t>(2 * parent + 1 < n) + static_cast<std::size_t>(2 * parent + 2 < n);
}

// The best of (depth + c - 1) x (hop + bytes / c / rate) over c = 1..kMaxChunks.
double pipeline_seconds(std::size_t depth, double bytes, double rate, double hop) {
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t c = 1; c <= kMaxChunks; ++c) {
    const double t = static_cast<double>(depth + c - 1) * (hop + bytes / static_cast<double>(c) / rate);
    best = std::min(best, t);
  }
  return best;
}

}  // namespace

double tree_allreduce_seconds(std::span<const double> egress, std::span<const double> ingress, double bytes,
                              double hop_seconds, std::size_t uploaders) {
  if (egress.size() != ingress.size()) throw std::invalid_argument("tree allreduce: one egress and ingress per worker");
  for (std::size_t i = 0; i < egress.size(); ++i) {
    if (!(egress[i] > 0) || !(ingress[i] > 0)) throw std::invalid_argument("tree allreduce: rates must be positive");
  }
  const std::size_t n = egress.size();
  if (n <= 1) return 0.0;
  uploaders = std::min(uploaders, n);
  if (uploaders < n && 2 * uploaders + 1 < n) {
    throw std::invalid_argument("tree allreduce: a position that does not upload must be a leaf");
  }
  double up = std::numeric_limits<double>::infinity(), down = up;
  for (std::size_t child = 1; child < n; ++child) {
    const std::size_t parent = (child - 1) / 2;
    const auto share = static_cast<double>(children_of(parent, n));
    down = std::min({down, egress[parent] / share, ingress[child]});
    if (child >= uploaders) continue;
    const auto senders = static_cast<double>(children_of(parent, std::min(n, uploaders)));
    up = std::min({up, egress[child], ingress[parent] / senders});
  }
  const auto depth = static_cast<std::size_t>(std::floor(std::log2(static_cast<double>(n))));  // edges, root to deepest
  return pipeline_seconds(depth, bytes, up, hop_seconds) + pipeline_seconds(depth, bytes, down, hop_seconds);
}

std::vector<std::uint32_t> place_slowest_at_leaves(std::span<const double> measured_egress) {
  std::vector<std::uint32_t> order(measured_egress.size());
  std::iota(order.begin(), order.end(), 0U);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return measured_egress[a] > measured_egress[b]; });
  return order;
}

}  // namespace gradlane::sched::sim
