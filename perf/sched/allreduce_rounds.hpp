// AllreduceRounds: what the cluster's allreduce modes decide for each round, and its price.
// The cluster runs the events (who is ready, when a round ends); this class holds the rest:
//  - the tree (tree modes): a random placement over a binary heap until the links are
//    measured; for gradlane-tree then the slowest at the leaves, and a shape (TreeShape);
//  - whom a round leaves out (skipping modes): the skip_slowest slowest at the last
//    measurement, nobody before one;
//  - each round's seconds at the links it runs on: a tree's (tree_allreduce.hpp) or a ring's,
//    of the workers not left out, then the mean sent to each left-out one by a distinct ring
//    member, the fastest ones, all at once. gradlane-tree's adaptive shape picks one of the
//    two on the measured links, each prediction scaled by its shape's last overrun.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "perf/sched/cluster_params.hpp"

namespace gradlane::sched::sim {

class AllreduceRounds {
 public:
  explicit AllreduceRounds(const ClusterParams& params);

  // The links as a probe or a round just read them: each worker's egress (skipping modes).
  void measure(std::span<const double> egress);
  // A round starts over links whose egress per worker is `egress`: whom it leaves out is
  // decided, and its seconds returned.
  double start_round(std::span<const double> egress);
  // Whether the round started last leaves `worker`'s model out.
  bool leaves_out(std::uint32_t worker) const { return !left_out_.empty() && left_out_[worker]; }
  std::uint64_t rounds_by_ring() const { return rounds_by_ring_; }

 private:
  double tree_seconds(std::span<const double> egress_of_worker) const;
  double ring_seconds(std::span<const double> egress_of_worker) const;
  // The workers' egress in tree position order (tree_order_).
  std::vector<double> by_position(std::span<const double> egress_of_worker) const;

  ClusterParams p_;
  const std::vector<double> ingress_;      // every worker's: the line rate
  std::vector<std::uint32_t> tree_order_;  // tree modes: the worker at each tree position
  std::vector<std::size_t> tree_parent_;   // tree modes: each position's parent (a heap until measured)
  bool measured_ = false;                  // skipping modes: a probe or a round measured the links
  std::vector<double> measured_egress_;    // skipping modes: each worker's, at the last measurement
  std::vector<bool> next_left_out_;        // skipping modes: from the last measurement
  std::vector<bool> left_out_;             // skipping modes: this round's
  std::size_t left_out_count_ = 0;
  // gradlane-tree, adaptive: how far each shape's last round ran over its prediction (>= 1).
  double tree_overrun_ = 1.0, ring_overrun_ = 1.0;
  std::uint64_t rounds_by_ring_ = 0;
};

}  // namespace gradlane::sched::sim
