// The time of a pipelined binary-tree allreduce (a reduce up the tree, then a broadcast down
// it, each in chunks), priced with the same assumptions as the simulator's ring: the rates are
// those when it starts, every hop pays a fixed cost, and a link carrying several streams at
// once splits its rate between them.
//
// The tree is a heap over positions 0..N-1: position i's children are 2i+1 and 2i+2, the root
// is 0, the leaves are the positions from N/2 on. `egress[i]` and `ingress[i]` are the rates
// (bytes/s) of the worker placed at position i. Reduce: every child streams its partial sum to
// its parent, the parent's ingress split between its children, so the pipeline runs at
// b_up = min over edges of min(child egress, parent ingress / children). Broadcast: every
// parent streams the mean to its children, its egress split between them: b_down = min over
// edges of min(parent egress / children, child ingress). A pipeline of c chunks over a path of
// d edges takes (d + c - 1) x (hop + bytes / c / b); c is chosen per direction to minimise it,
// as NCCL picks its chunk size.
//
// Placement decides the bottlenecks: a slow worker at a leaf slows only the reduce (its own
// upload); an inner one slows the reduce and the broadcast, and at the root every byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace gradlane::sched::sim {

// Seconds for `bytes` to be allreduced over the tree; 0 for a single worker. Only the first
// `uploaders` positions send up (the rest must be leaves: they only receive the broadcast);
// by default all. Throws std::invalid_argument if the spans differ in size, a rate is not
// positive, or a position that does not upload has children.
double tree_allreduce_seconds(std::span<const double> egress, std::span<const double> ingress, double bytes,
                              double hop_seconds, std::size_t uploaders = std::numeric_limits<std::size_t>::max());

// The placement a scheduler that measured each worker's egress would choose: the fastest at the
// root, the slowest at the leaves (positions in descending egress; ties by worker index).
std::vector<std::uint32_t> place_slowest_at_leaves(std::span<const double> measured_egress);

}  // namespace gradlane::sched::sim
