#include "perf/sched/allreduce_rounds.hpp"

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

namespace gradlane::sched::sim {

AllreduceRounds::AllreduceRounds(const ClusterParams& params)
    : p_(params), ingress_(params.workers, params.worker_gbps * kGbps) {
  if (reduces_by_tree(p_.mode)) {  // ranks in an order the rates do not know: a random one, fixed
    tree_order_.resize(p_.workers);
    std::iota(tree_order_.begin(), tree_order_.end(), 0U);
    std::mt19937_64 placement(p_.seed ^ 0x5bd1e995ULL);
    std::shuffle(tree_order_.begin(), tree_order_.end(), placement);
    tree_parent_ = heap_tree(p_.workers);
  }
}

std::vector<double> AllreduceRounds::by_position(std::span<const double> egress_of_worker) const {
  std::vector<double> egress(tree_order_.size());
  for (std::size_t i = 0; i < tree_order_.size(); ++i) egress[i] = egress_of_worker[tree_order_[i]];
  return egress;
}

void AllreduceRounds::measure(std::span<const double> egress) {
  measured_egress_.assign(egress.begin(), egress.end());
  const std::vector<std::uint32_t> fastest_first = place_slowest_at_leaves(measured_egress_);
  next_left_out_.assign(p_.workers, false);
  for (std::size_t i = p_.workers - p_.skip_slowest; i < p_.workers; ++i) next_left_out_[fastest_first[i]] = true;
  if (p_.mode == Mode::gradlane_tree) {
    tree_order_ = fastest_first;             // the slowest at the leaves
    if (p_.tree_shape != TreeShape::heap) {  // each worker given the children its egress carries
      tree_parent_ = rate_aware_tree(by_position(measured_egress_), ingress_, p_.workers - p_.skip_slowest);
    }
  }
  measured_ = true;
}

double AllreduceRounds::start_round(std::span<const double> egress) {
  if (skips_slowest(p_.mode)) {  // the last measurement decides whom this round leaves out
    left_out_ = measured_ ? next_left_out_ : std::vector<bool>(p_.workers, false);
    left_out_count_ = measured_ ? p_.skip_slowest : 0;
  }
  if (p_.workers == 1) return 0;
  if (p_.mode != Mode::gradlane_tree || p_.tree_shape != TreeShape::adaptive) {
    return reduces_by_tree(p_.mode) ? tree_seconds(egress) : ring_seconds(egress);
  }
  // The shape is chosen on the measured links; the round then takes what the links give.
  bool by_tree = false;
  double predicted = 0;
  if (measured_) {
    const double tree = tree_seconds(measured_egress_), ring = ring_seconds(measured_egress_);
    by_tree = tree * tree_overrun_ < ring * ring_overrun_;
    predicted = by_tree ? tree : ring;
  }
  const double seconds = by_tree ? tree_seconds(egress) : ring_seconds(egress);
  if (predicted > 0) (by_tree ? tree_overrun_ : ring_overrun_) = std::max(1.0, seconds / predicted);
  if (!by_tree) ++rounds_by_ring_;
  return seconds;
}

double AllreduceRounds::tree_seconds(std::span<const double> egress_of_worker) const {
  return tree_allreduce_seconds(tree_parent_, by_position(egress_of_worker), ingress_, static_cast<double>(p_.bytes),
                                p_.ring_hop_us * 1e-6, p_.tree_phases, p_.workers - left_out_count_);
}

double AllreduceRounds::ring_seconds(std::span<const double> egress_of_worker) const {
  const double line_rate = p_.worker_gbps * kGbps;  // every worker's ingress
  double slowest = line_rate;
  std::vector<double> members;
  for (std::uint32_t w = 0; w < p_.workers; ++w) {
    if (leaves_out(w)) continue;
    slowest = std::min(slowest, egress_of_worker[w]);
    members.push_back(egress_of_worker[w]);
  }
  const auto n = static_cast<double>(members.size());
  const double hop = p_.ring_hop_us * 1e-6, bytes = static_cast<double>(p_.bytes);
  double seconds = n > 1 ? 2 * (n - 1) * (hop + bytes / n / slowest) : 0.0;
  if (left_out_count_ > 0) {
    std::sort(members.begin(), members.end(), std::greater<>());
    seconds += hop + bytes / std::min(members[std::min(left_out_count_, members.size()) - 1], line_rate);
  }
  return seconds;
}

}  // namespace gradlane::sched::sim
