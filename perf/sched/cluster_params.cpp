// The simulated cluster's settings: the modes, network models and pull costs by name, and
// ClusterParams::validate (cluster_params.hpp).
#include <stdexcept>
#include <string>

#include "perf/sched/cluster_params.hpp"

namespace gradlane::sched::sim {

const char* to_string(Mode mode) {
  switch (mode) {
    case Mode::fifo:
      return "fifo";
    case Mode::gradlane:
      return "gradlane";
    case Mode::sync:
      return "sync";
    case Mode::fifo_sa:
      return "fifo-sa";
    case Mode::backup:
      return "backup";
    case Mode::ssp:
      return "ssp";
    case Mode::ring:
      return "ring";
    case Mode::local:
      return "local";
    case Mode::gradlane_local:
      return "gradlane-local";
    case Mode::local_ring:
      return "local-ring";
    case Mode::local_tree:
      return "local-tree";
    case Mode::gradlane_tree:
      return "gradlane-tree";
    case Mode::local_ring_skip:
      return "local-ring-skip";
  }
  return "?";
}

Mode parse_mode(const std::string& name) {
  if (name == "fifo") return Mode::fifo;
  if (name == "gradlane") return Mode::gradlane;
  if (name == "sync") return Mode::sync;
  if (name == "fifo-sa") return Mode::fifo_sa;
  if (name == "backup") return Mode::backup;
  if (name == "ssp") return Mode::ssp;
  if (name == "ring") return Mode::ring;
  if (name == "local") return Mode::local;
  if (name == "gradlane-local") return Mode::gradlane_local;
  if (name == "local-ring") return Mode::local_ring;
  if (name == "local-tree") return Mode::local_tree;
  if (name == "gradlane-tree") return Mode::gradlane_tree;
  if (name == "local-ring-skip") return Mode::local_ring_skip;
  throw std::invalid_argument("unknown mode '" + name +
                              "': use gradlane, fifo, sync, fifo-sa, backup, ssp, ring, local, local-ring, "
                              "local-ring-skip, local-tree, gradlane-local or gradlane-tree");
}

bool is_synchronous(Mode mode) {
  return mode == Mode::sync || mode == Mode::backup || allreduces(mode) || averages_models(mode);
}

bool averages_models(Mode mode) {
  return mode == Mode::local || mode == Mode::local_ring || mode == Mode::local_ring_skip || mode == Mode::local_tree ||
         mode == Mode::gradlane_local || mode == Mode::gradlane_tree;
}

bool allreduces(Mode mode) {
  return mode == Mode::ring || mode == Mode::local_ring || mode == Mode::local_ring_skip || mode == Mode::local_tree ||
         mode == Mode::gradlane_tree;
}

bool skips_slowest(Mode mode) { return mode == Mode::gradlane_tree || mode == Mode::local_ring_skip; }

bool reduces_by_tree(Mode mode) { return mode == Mode::local_tree || mode == Mode::gradlane_tree; }

bool uses_gradlane_grants(Mode mode) { return mode == Mode::gradlane || mode == Mode::gradlane_local; }

const char* to_string(NetworkModel network) {
  switch (network) {
    case NetworkModel::fair:
      return "fair";
    case NetworkModel::exclusive:
      return "exclusive";
  }
  return "?";
}

NetworkModel parse_network_model(const std::string& name) {
  if (name == "fair") return NetworkModel::fair;
  if (name == "exclusive") return NetworkModel::exclusive;
  throw std::invalid_argument("unknown network model '" + name + "': use fair or exclusive");
}

const char* to_string(IngressSharing ingress) { return ingress == IngressSharing::packed ? "packed" : "exclusive"; }

IngressSharing parse_ingress_sharing(const std::string& name) {
  if (name == "packed") return IngressSharing::packed;
  if (name == "exclusive") return IngressSharing::exclusive;
  throw std::invalid_argument("unknown ingress sharing '" + name + "': use packed or exclusive");
}

TreeShape parse_tree_shape(const std::string& name) {
  if (name == "heap") return TreeShape::heap;
  if (name == "rate-aware") return TreeShape::rate_aware;
  if (name == "adaptive") return TreeShape::adaptive;
  throw std::invalid_argument("unknown tree shape '" + name + "': use heap, rate-aware or adaptive");
}

const char* to_string(TreeShape shape) {
  switch (shape) {
    case TreeShape::heap:
      return "heap";
    case TreeShape::rate_aware:
      return "rate-aware";
    case TreeShape::adaptive:
      return "adaptive";
  }
  return "?";
}

const char* to_string(PullCost pulls) { return pulls == PullCost::priced ? "priced" : "free"; }

PullCost parse_pull_cost(const std::string& name) {
  if (name == "priced") return PullCost::priced;
  if (name == "free") return PullCost::free;
  throw std::invalid_argument("unknown pull cost '" + name + "': use priced or free");
}

std::optional<std::string> ClusterParams::validate() const {
  if (workers == 0) return "workers must be at least 1";
  if (servers == 0) return "servers must be at least 1";
  if (stragglers > workers) return "stragglers cannot exceed workers";
  if (is_synchronous(mode) && servers != 1)
    return "sync, backup, ring and local modes simulate one server (ring: its version)";
  if (allreduces(mode) && !(ring_hop_us >= 0)) return "ring hop cost must be >= 0";
  if (averages_models(mode) && local_steps == 0) return "local SGD needs at least 1 local step per average";
  if (mode == Mode::backup && backup_workers >= workers) return "backup workers must be fewer than workers";
  if (skip_slowest > 0 && !skips_slowest(mode)) return "only gradlane-tree and local-ring-skip skip the slowest links";
  if (skip_slowest >= workers) return "skip fewer of the slowest links than there are workers";
  if (probe_bytes > 0 && !skips_slowest(mode)) return "only gradlane-tree and local-ring-skip probe the links";
  if (mode == Mode::gradlane_tree && 2 * (std::uint64_t{workers} - skip_slowest) + 1 < workers) {
    return "gradlane-tree can skip at most half the workers (those it skips are leaves)";
  }
  if (mode == Mode::gradlane_tree && tree_shape != TreeShape::heap && tree_phases != TreePhases::overlapped) {
    return "gradlane-tree shapes its tree for overlapped phases: with sequential ones, use the heap shape";
  }
  if (bytes == 0) return "bytes must be positive";
  if (!(compute_ms > 0) || !(worker_gbps > 0) || !(server_gbps > 0)) {
    return "compute time and line rates must be positive";
  }
  if (!(jitter >= 0 && jitter < 1)) return "jitter must be in [0, 1)";
  if (!(spread >= 1)) return "spread must be at least 1 (1: every worker at its line rate)";
  if (!(change_ms >= 0) || !(change_fraction >= 0 && change_fraction <= 1)) {
    return "change interval must be >= 0 and the changed fraction in [0, 1]";
  }
  if (!(straggler_slowdown >= 1)) return "straggler slowdown must be at least 1";
  return std::nullopt;
}

}  // namespace gradlane::sched::sim
