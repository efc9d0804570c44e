// The time of a pipelined tree allreduce, priced with the same assumptions as the simulator's
// ring: the rates are those when it starts, every hop pays a fixed cost, and a link carrying
// several streams at once splits its rate between them.
//
// A tree is a parent per position (kRoot for the root); `egress[i]` and `ingress[i]` are the
// rates (bytes/s) of the worker placed at position i, and the first `uploaders` positions send
// up (the rest only receive the mean: they must be leaves). A pipeline of c chunks over a path
// of e edges takes (e + c - 1) x (hop + bytes / c / b) at rate b; c is chosen to minimise it,
// as NCCL picks its chunk size. Two ways to run the phases:
//  - sequential: the reduce up (each child streams its partial sum, its parent's ingress split
//    between its uploading children: b_up = min over edges of min(child egress, parent ingress
//    / uploading children)), then the broadcast down (b_down = min over edges of min(parent
//    egress / children, child ingress)), each over the tree's depth d;
//  - overlapped, as NCCL's tree runs them: the root forwards each reduced chunk down while the
//    next comes up, so a node's egress carries its stream up and one to each child, its
//    ingress one from each uploading child and one from its parent; b = the smallest of those
//    shares, over a path of 2d edges.
//
// Placement and shape decide the bottlenecks. In a binary heap (children 2i+1 and 2i+2) an inner
// node carries its children's streams and a leaf only its own, so a slow worker costs least at a
// leaf. A scheduler that measured the egress can also shape the tree: give each worker as many
// children as its egress carries at the rate the slowest uploader allows (rate_aware_tree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace gradlane::sched::sim {

inline constexpr std::size_t kRoot = std::numeric_limits<std::size_t>::max();

enum class TreePhases { sequential, overlapped };

// A binary heap over n positions: position i's parent is (i - 1) / 2.
std::vector<std::size_t> heap_tree(std::size_t n);

// The tree a scheduler that measured each position's egress builds: the largest pipeline rate b
// at which every position's egress carries its streams (one up, one per child) and its ingress
// its streams in, running the phases overlapped, each node given as many children as that
// allows, filled breadth-first in position order (pass the positions fastest first). Positions from `uploaders` on are
// leaves. Throws std::invalid_argument as tree_allreduce_seconds does, or if no tree exists (an uploader's egress
// cannot carry its own stream and there is nobody to take the others).
std::vector<std::size_t> rate_aware_tree(std::span<const double> egress, std::span<const double> ingress,
                                         std::size_t uploaders = std::numeric_limits<std::size_t>::max());

// Seconds for `bytes` to be allreduced over the tree; 0 for a single worker. Throws
// std::invalid_argument if the spans differ in size, a rate is not positive, the parents do not
// form one tree rooted at a position of their own, or a position that does not upload has
// children.
double tree_allreduce_seconds(std::span<const std::size_t> parent, std::span<const double> egress,
                              std::span<const double> ingress, double bytes, double hop_seconds,
                              TreePhases phases = TreePhases::overlapped,
                              std::size_t uploaders = std::numeric_limits<std::size_t>::max());

// The placement a scheduler that measured each worker's egress would choose: the fastest at the
// root, the slowest at the leaves (positions in descending egress; ties by worker index).
std::vector<std::uint32_t> place_slowest_at_leaves(std::span<const double> measured_egress);

}  // namespace gradlane::sched::sim
