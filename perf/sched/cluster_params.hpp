// The simulated cluster's settings (ClusterParams) and the names of its modes, network models,
// pull costs and tree shapes: what a Cluster (cluster.hpp) is built from, and what the
// simulators' command lines parse.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "perf/sched/tree_allreduce.hpp"
#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched::sim {

inline constexpr double kGbps = 1e9 / 8;  // bytes per second in one Gb/s

enum class Mode : std::uint8_t {
  fifo,             // plain asynchronous parameter server: arrival order, no drops, no aggregation
  gradlane,         // the sidecar's ordering (MLfabric): SJF, tau drops, aggregation, replica window
  sync,             // synchronous SGD: barrier per step
  fifo_sa,          // fifo's traffic; each gradient's learning rate divided by its delay (the Observer)
  backup,           // synchronous SGD, a step applied when the first workers - b of it arrived
  ssp,              // fifo, but no worker's clock more than ssp_bound ahead of the slowest's
  ring,             // synchronous SGD by ring allreduce between the workers: no server
  local,            // local SGD: sync's traffic once every local_steps minibatches, models averaged
  gradlane_local,   // local SGD's rounds, each model change granted and aggregated by gradlane
  local_ring,       // local SGD whose models are averaged by ring allreduce: no server
  local_tree,       // local SGD averaged by a pipelined binary-tree allreduce, ranks in a random order
  gradlane_tree,    // the same tree, placed by the scheduler: the slowest measured links at the leaves
  local_ring_skip,  // local-ring leaving out the skip_slowest slowest measured links, as gradlane-tree does
};
// Modes with a barrier per step (every worker computes on the same model).
bool is_synchronous(Mode mode);
// Modes whose step is local_steps minibatches per worker and the mean of the workers' models.
bool averages_models(Mode mode);
// Modes whose step is allreduced between the workers, by ring or tree (no server traffic).
bool allreduces(Mode mode);
// The tree modes (tree_allreduce.hpp prices their allreduce).
bool reduces_by_tree(Mode mode);
// The allreduce gradlane-tree runs over the workers it placed, the slowest at the leaves:
//  - heap: a binary heap;
//  - rate_aware: shaped to the measured links (rate_aware_tree: each worker given as many
//    children as its egress carries; overlapped phases only);
//  - adaptive: each round, the rate-aware tree or a ring of the workers not left out (priced as
//    local-ring-skip's), whichever the measured links predict is sooner once each prediction is
//    scaled by how far that shape's last round ran over its own; a ring until the links are
//    measured, since a tree's price depends on where the unknown slow links sit. Links that
//    change within a round overrun a shaped tree's prediction and send it back to the ring.
enum class TreeShape { heap, rate_aware, adaptive };
TreeShape parse_tree_shape(const std::string& name);
const char* to_string(TreeShape shape);

// Modes that, once they measured the links, leave the skip_slowest slowest out of a round.
bool skips_slowest(Mode mode);
// Modes whose transfers start at the scheduling core's slots (SJF, packed ingress, aggregation).
bool uses_gradlane_grants(Mode mode);
const char* to_string(Mode mode);
// A name to_string() returns; throws std::invalid_argument naming the accepted ones.
Mode parse_mode(const std::string& name);

enum class PullCost : std::uint8_t {
  priced,  // a pull crosses the server's egress and the worker's ingress (fair network only)
  free,    // a pull takes no time
};
const char* to_string(PullCost pulls);
// "priced" or "free"; throws std::invalid_argument naming the accepted ones.
PullCost parse_pull_cost(const std::string& name);

enum class NetworkModel : std::uint8_t {
  fair,       // each NIC direction shared max-min fairly by the transfers crossing it
  exclusive,  // each NIC direction carries one transfer at a time, at the slower NIC's rate
};
const char* to_string(NetworkModel network);
// "fair" or "exclusive"; throws std::invalid_argument naming the accepted ones.
NetworkModel parse_network_model(const std::string& name);
const char* to_string(IngressSharing ingress);
// "packed" or "exclusive"; throws std::invalid_argument naming the accepted ones.
IngressSharing parse_ingress_sharing(const std::string& name);

struct ClusterParams {
  std::uint32_t workers = 1000;
  std::uint32_t servers = 1;
  Bytes bytes = Bytes{1} << 20;
  double compute_ms = 45.0;
  double jitter = 0.2;
  double worker_gbps = 100.0;
  double server_gbps = 100.0;
  std::uint32_t stragglers = 1;
  double straggler_slowdown = 10.0;
  double spread = 1.0;           // worker egress factor log-uniform in [1/spread, 1]
  double change_ms = 0.0;        // 0: the factors never change
  double change_fraction = 0.1;  // share of workers redrawn per change
  std::uint64_t replica_bound = 64;
  double replica_lag_us = 20.0;
  double horizon_us = static_cast<double>(SchedulerConfig{}.grant_horizon.count()) / 1e3;
  std::uint64_t seed = 1;

  Mode mode = Mode::gradlane;
  NetworkModel network = NetworkModel::fair;
  PullCost pulls = PullCost::priced;
  std::optional<std::uint32_t> tau = 500;  // gradlane only
  // gradlane over the fair network only: how the scheduler shares a server's ingress between
  // its grants (SchedulerConfig::ingress). The exclusive network serialises transfers anyway.
  IngressSharing ingress = IngressSharing::packed;
  bool aggregation = true;           // gradlane and gradlane-local only
  std::uint32_t backup_workers = 1;  // backup only: b, of `workers`; a step averages workers - b
  std::uint64_t ssp_bound = 3;       // ssp only: s, the clock lead allowed over the slowest
  double ring_hop_us = 5.0;          // ring only: the fixed cost of each of its 2(N-1) phases
  std::uint32_t local_steps = 4;     // local, gradlane-local: H, minibatches between two averages
  // gradlane-tree and local-ring-skip: once the links are measured, a round does not wait for
  // this many of the slowest: they send no model (their local work is dropped, as backup
  // workers') and receive the mean (gradlane-tree: at the leaves; local-ring-skip: from a ring
  // member after the allreduce).
  std::uint32_t skip_slowest = 0;
  // Tree modes: the reduce and the broadcast overlapped, as NCCL runs them, or one after the
  // other (tree_allreduce.hpp).
  TreePhases tree_phases = TreePhases::overlapped;
  // gradlane-tree only (TreeShape).
  TreeShape tree_shape = TreeShape::adaptive;
  // gradlane-tree and local-ring-skip: measure the links as an allreduce ends (true: what a
  // probe between rounds reads for the next one) or as it starts (false: a round staler).
  bool measure_links_at_round_end = true;
  // gradlane-tree and local-ring-skip: before the first round every worker sends this many bytes
  // at once to measure its egress, during its first minibatch; the first round starts once the
  // slowest probe has ended, on measured links. 0: no probe (the first round waits for every
  // worker, on a ring).
  std::uint64_t probe_bytes = 0;

  // A message naming the first unusable field, or nullopt.
  std::optional<std::string> validate() const;
};

}  // namespace gradlane::sched::sim
