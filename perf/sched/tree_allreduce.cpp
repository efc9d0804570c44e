#include "perf/sched/tree_allreduce.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace gradlane::sched::sim {
namespace {

constexpr std::size_t kMaxChunks = 4096;

// The best of (edges + c - 1) x (hop + bytes / c / rate) over c = 1..kMaxChunks.
double pipeline_seconds(std::size_t edges, double bytes, double rate, double hop) {
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t c = 1; c <= kMaxChunks; ++c) {
    const double t = static_cast<double>(edges + c - 1) * (hop + bytes / static_cast<double>(c) / rate);
    best = std::min(best, t);
  }
  return best;
}

void check_rates(std::span<const double> egress, std::span<const double> ingress) {
  if (egress.size() != ingress.size()) throw std::invalid_argument("tree allreduce: one egress and ingress per worker");
  for (std::size_t i = 0; i < egress.size(); ++i) {
    if (!(egress[i] > 0) || !(ingress[i] > 0)) throw std::invalid_argument("tree allreduce: rates must be positive");
  }
}

// Edges from the root to the deepest position; throws unless the parents form one tree.
std::size_t depth_of(std::span<const std::size_t> parent) {
  const std::size_t n = parent.size();
  if (std::count(parent.begin(), parent.end(), kRoot) != 1) throw std::invalid_argument("tree allreduce: one root");
  constexpr std::size_t kUnknown = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> depth(n, kUnknown);
  std::vector<std::size_t> path;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t at = i;
    path.clear();
    while (depth[at] == kUnknown && parent[at] != kRoot) {
      if (parent[at] >= n || path.size() > n) throw std::invalid_argument("tree allreduce: the parents form no tree");
      path.push_back(at);
      at = parent[at];
    }
    std::size_t d = depth[at] == kUnknown ? 0 : depth[at];
    depth[at] = d;
    for (auto it = path.rbegin(); it != path.rend(); ++it) depth[*it] = ++d;
  }
  return *std::max_element(depth.begin(), depth.end());
}

// rate_aware_tree at pipeline rate b, breadth-first; empty if no tree carries b.
std::vector<std::size_t> tree_at_rate(std::span<const double> egress, std::span<const double> ingress,
                                      std::size_t uploaders, double b) {
  const std::size_t n = egress.size();
  std::vector<std::size_t> parent(n, kRoot);
  for (std::size_t i = 1; i < n; ++i) {
    if (ingress[i] < b || (i < uploaders && egress[i] < b)) return {};  // its own stream down, or up
  }
  std::size_t next = 1;
  for (std::size_t p = 0; next < n; ++p) {
    if (p == next || p >= uploaders) return {};  // nobody attached is left to take the rest
    const double own = p == 0 ? 0.0 : 1.0;       // the stream up (out) and the one down (in)
    const auto out = static_cast<std::size_t>(std::floor(egress[p] / b - own));
    const auto in = static_cast<std::size_t>(std::floor(ingress[p] / b - own));
    for (std::size_t kids = 0, up = 0; next < n && kids < out; ++kids, ++next) {
      if (next < uploaders && up++ == in) break;
      parent[next] = p;
    }
  }
  return parent;
}

}  // namespace

std::vector<std::size_t> heap_tree(std::size_t n) {
  std::vector<std::size_t> parent(n, kRoot);
  for (std::size_t i = 1; i < n; ++i) parent[i] = (i - 1) / 2;
  return parent;
}

std::vector<std::size_t> rate_aware_tree(std::span<const double> egress, std::span<const double> ingress,
                                         std::size_t uploaders) {
  check_rates(egress, ingress);
  const std::size_t n = egress.size();
  uploaders = std::min(uploaders, n);
  if (n <= 1) return std::vector<std::size_t>(n, kRoot);
  double lo = 0, hi = *std::max_element(egress.begin(), egress.end());
  if (tree_at_rate(egress, ingress, uploaders, hi * 1e-9).empty()) {
    throw std::invalid_argument("tree allreduce: no tree over these positions (does the first one upload?)");
  }
  for (int i = 0; i < 60; ++i) {  // the largest b a tree carries; capacities only grow as b falls
    const double mid = (lo + hi) / 2;
    (tree_at_rate(egress, ingress, uploaders, mid).empty() ? hi : lo) = mid;
  }
  return tree_at_rate(egress, ingress, uploaders, std::max(lo, hi * 1e-9));
}

double tree_allreduce_seconds(std::span<const std::size_t> parent, std::span<const double> egress,
                              std::span<const double> ingress, double bytes, double hop_seconds, TreePhases phases,
                              std::size_t uploaders) {
  check_rates(egress, ingress);
  if (parent.size() != egress.size()) throw std::invalid_argument("tree allreduce: one parent per worker");
  const std::size_t n = egress.size();
  if (n <= 1) return 0.0;
  uploaders = std::min(uploaders, n);
  const std::size_t depth = depth_of(parent);
  // Streams through each position's links, up (its partial sum, its children's) and down.
  std::vector<double> up_out(n, 0.0), up_in(n, 0.0), down_out(n, 0.0), down_in(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    if (parent[i] == kRoot) continue;
    if (parent[i] >= uploaders)
      throw std::invalid_argument("tree allreduce: a position that does not upload must be a leaf");
    down_out[parent[i]] += 1;
    down_in[i] += 1;
    if (i < uploaders) {
      up_out[i] += 1;
      up_in[parent[i]] += 1;
    }
  }
  // The rate of streams sharing links whose streams are counted in `out` and `in`.
  const auto rate_of = [&](const std::vector<double>& out, const std::vector<double>& in) {
    double rate = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < n; ++i) {
      if (out[i] > 0) rate = std::min(rate, egress[i] / out[i]);
      if (in[i] > 0) rate = std::min(rate, ingress[i] / in[i]);
    }
    return rate;
  };
  if (phases == TreePhases::sequential) {
    const double up = rate_of(up_out, up_in), down = rate_of(down_out, down_in);
    return pipeline_seconds(depth, bytes, up, hop_seconds) + pipeline_seconds(depth, bytes, down, hop_seconds);
  }
  std::vector<double> out(n), in(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = up_out[i] + down_out[i];
    in[i] = up_in[i] + down_in[i];
  }
  return pipeline_seconds(2 * depth, bytes, rate_of(out, in), hop_seconds);
}

std::vector<std::uint32_t> place_slowest_at_leaves(std::span<const double> measured_egress) {
  std::vector<std::uint32_t> order(measured_egress.size());
  std::iota(order.begin(), order.end(), 0U);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return measured_egress[a] > measured_egress[b]; });
  return order;
}

}  // namespace gradlane::sched::sim
