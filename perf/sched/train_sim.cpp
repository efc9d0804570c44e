// gradlane_train_sim: trains softmax regression (or the MLP) on Fashion-MNIST in simulated
// time over a simulated 1,000-worker parameter server (cluster.hpp), in one mode — gradlane
// (the sidecar's ordering, tau drops, aggregation), fifo (a plain asynchronous parameter
// server), sync (barrier per step), or a baseline from the literature: fifo-sa (staleness-aware
// learning rate), backup (sync with backup workers), ssp (stale-synchronous parallel) — and
// reports accuracy over simulated time and the time to a target accuracy. perf/sched/train-sim-experiment runs the
// grid, the modes, the regimes and the tau sweep and writes its tables to perf/results/train-sim-NETWORK/ (raw runs to
// out/).
//
// Data: the first --train-rows of Fashion-MNIST's training set train; --eval validation
// evaluates on the rest of it (the last 10,000 rows by default: for choosing the learning
// rate), --eval test on the full 10,000-image test set (for the reported figures).
//
// The default tau is 2N versions (N workers) — see default_tau() for why.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "perf/sched/training.hpp"

namespace {

using namespace gradlane;
using namespace gradlane::sched;

// With N asynchronous workers every update is about N versions old when it is applied (all
// the others land while it computes): that is the natural delay, not a straggler. A bound
// below it drops healthy updates wholesale (tau = N/2 drops about half of them, and the
// server then idles while their workers recompute); the bound is for the tail that a slow
// link or a queue adds on top. 2N keeps every update of an unloaded cluster and cuts only
// those at least twice as stale as the typical one. Measured in the tau sweep
// (perf/results/train-sim/): see docs/results.md, "Simulator with real convergence".
std::uint32_t default_tau(std::uint32_t workers) { return 2 * workers; }

// Chen et al. run about 5% spares; 1% of the cluster (at least one) already absorbs the
// default regime's 1% stragglers, and the comparison with sync stays at nearly N per step.
std::uint32_t default_backup_workers(std::uint32_t workers) { return std::max<std::uint32_t>(1, workers / 100); }

std::uint64_t percentile(std::vector<std::uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

void print_progress(const sim::EvalPoint& e, void* quiet) {
  if (*static_cast<bool*>(quiet)) return;
  std::fprintf(stderr, "\r  t %7.0f ms  acc %.4f  gradients %9llu  versions %8llu  drops %7llu  (%.1f s)   ", e.t_ms,
               e.accuracy, static_cast<unsigned long long>(e.gradients), static_cast<unsigned long long>(e.updates),
               static_cast<unsigned long long>(e.drops), e.wall_s);
}

}  // namespace

int main(int argc, char** argv) try {
  sim::ClusterParams c;
  // The defaults, the overloaded regime: 1,000 workers computing 10 ms steps over uneven,
  // changing 25 Gb/s links (each worker at 1/4..1 of it, 10 stragglers at a further 1/10) into
  // a 25 Gb/s server: 100,000 updates offered per second, about what its line rate carries.
  // (With --network exclusive an update holds the server alone at its sender's rate, ~22 us on
  // average, and it takes ~45,000.) --worker-gbps 100 --server-gbps 100 is the light regime.
  c.workers = 1000;
  c.compute_ms = 10.0;
  c.worker_gbps = 25.0;
  c.server_gbps = 25.0;
  c.spread = 4.0;
  c.change_ms = 100.0;
  c.change_fraction = 0.2;
  c.stragglers = 10;
  c.straggler_slowdown = 10.0;
  sim::TrainParams t;
  std::string network = sim::to_string(c.network);
  std::string pulls = sim::to_string(c.pulls);
  std::string tree_phases = "overlapped", tree_shape = sim::to_string(c.tree_shape), measure_links = "end";
  std::string ingress = sim::to_string(c.ingress);
  std::string mode = "gradlane", model_name = "softmax", eval = "test", data_dir = train::kDefaultFashionMnistDir;
  std::string json_path, csv_path;
  std::int64_t tau = -1;               // -1: default_tau(workers); 0: unbounded
  std::int64_t backup_workers = -1;    // -1: default_backup_workers(workers)
  std::int64_t skip = -1;              // -1: default_backup_workers(workers) where the mode skips, else 0
  Bytes probe_bytes = Bytes{1} << 20;  // where the mode skips; else no probe
  bool no_aggregation = false, quiet = false;
  std::size_t train_rows = 50'000;
  Bytes update_bytes = 0;  // 0: the model's own size

  CLI::App app{"gradlane_train_sim: train Fashion-MNIST in simulated time over a simulated parameter server"};
  app.add_option("--mode", mode,
                 "gradlane, fifo, sync, fifo-sa (fifo, lr / delay), backup (sync with backup workers) or "
                 "ssp (fifo within a clock bound) or ring (sync by ring allreduce, no server) or local "
                 "(local SGD: models averaged every --local-steps minibatches, through the server) or local-ring "
                 "(local SGD averaged by ring allreduce) or local-ring-skip (the same, leaving out the slowest "
                 "measured links, as gradlane-tree does) or local-tree (by a binary-tree allreduce, ranks in a "
                 "random order) or gradlane-tree (the tree placed by the scheduler: the slowest measured links at "
                 "the leaves) or gradlane-local (local SGD's "
                 "rounds, each model change granted and aggregated by gradlane's scheduler)")
      ->check(CLI::IsMember({"gradlane", "fifo", "sync", "fifo-sa", "backup", "ssp", "ring", "local", "local-ring",
                             "local-ring-skip", "local-tree", "gradlane-local", "gradlane-tree"}));
  app.add_option("--lr", t.learning_rate, "learning rate (sync: of the averaged gradient)")->check(CLI::PositiveNumber);
  app.add_option("--tau", tau, "staleness bound in versions (gradlane); 0 = unbounded; default 2 x workers");
  app.add_flag("--no-aggregation", no_aggregation, "gradlane without aggregation");
  app.add_option("--backup-workers", backup_workers,
                 "backup: b of --workers are spares, a step averages the first workers - b; default 1% (>= 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ssp-bound", c.ssp_bound, "ssp: a worker's clock may lead the slowest's by at most this");
  app.add_option("--local-steps", c.local_steps,
                 "local, gradlane-local: minibatches each worker trains on between two averages")
      ->check(CLI::PositiveNumber);
  app.add_option("--skip-slowest", skip,
                 "gradlane-tree, local-ring-skip: once the links are measured, a round does not wait for this many "
                 "of the slowest "
                 "(their models are left out, as backup workers'; they receive the mean); default 1% (>= 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ring-hop-us", c.ring_hop_us,
                 "ring and tree modes: the fixed cost of each hop (ring: each of its 2(N-1) phases)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tree-phases", tree_phases,
                 "tree modes: overlapped (reduce and broadcast at once, as NCCL's tree) or sequential")
      ->check(CLI::IsMember({"sequential", "overlapped"}));
  app.add_option("--tree-shape", tree_shape,
                 "gradlane-tree: heap (a binary heap, slowest at the leaves), rate-aware (each worker given the "
                 "children its measured egress carries) or adaptive (each round the rate-aware tree or a ring, "
                 "whichever the measured links predict is sooner, corrected by each one's last overrun)")
      ->check(CLI::IsMember({"heap", "rate-aware", "adaptive"}));
  app.add_option("--measure-links", measure_links,
                 "gradlane-tree, local-ring-skip: measure the links as an allreduce ends (end) or starts (start)")
      ->check(CLI::IsMember({"start", "end"}));
  app.add_option("--probe-bytes", probe_bytes,
                 "gradlane-tree, local-ring-skip: before the first round every worker sends this many bytes to "
                 "measure its egress, during its first minibatch; 0: no probe (the first round is a ring of every "
                 "worker)");
  app.add_flag("--data-shards", t.data_shards, "each worker samples only its own contiguous part of the data");
  app.add_option("--network", network,
                 "fair: each NIC shared max-min fairly by the transfers crossing it; "
                 "exclusive: one transfer at a time per NIC direction")
      ->check(CLI::IsMember({"fair", "exclusive"}));
  app.add_option("--pulls", pulls,
                 "priced: a worker's pull of the model crosses the server's egress and its own ingress before "
                 "it computes (fair network; ring's modes pay their allgather instead); free: it takes no time")
      ->check(CLI::IsMember({"priced", "free"}));
  app.add_option("--ingress", ingress,
                 "gradlane over the fair network: packed (grants share the server's ingress, each at the "
                 "share of its line rate the sender can use) or exclusive (one grant at a time)")
      ->check(CLI::IsMember({"packed", "exclusive"}));
  app.add_option("--workers", c.workers, "simulated workers")->check(CLI::Range(1u, 100000u));
  app.add_option("--compute-ms", c.compute_ms, "mean compute time per step")->check(CLI::PositiveNumber);
  app.add_option("--jitter", c.jitter, "compute time is uniform in mean*(1 +- jitter)")->check(CLI::Range(0.0, 0.99));
  app.add_option("--worker-gbps", c.worker_gbps, "worker NIC line rate (declared)")->check(CLI::PositiveNumber);
  app.add_option("--server-gbps", c.server_gbps, "server NIC line rate")->check(CLI::PositiveNumber);
  app.add_option("--spread", c.spread, "worker egress log-uniform in [rate/spread, rate]")->check(CLI::Range(1.0, 1e6));
  app.add_option("--change-ms", c.change_ms, "every this often, redraw some workers' egress (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--change-fraction", c.change_fraction, "share of workers redrawn per change")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--stragglers", c.stragglers, "workers whose egress is further slowed");
  app.add_option("--straggler-slowdown", c.straggler_slowdown, "by this factor")->check(CLI::Range(1.0, 1e6));
  app.add_option("--replica-bound", c.replica_bound, "B: sequence numbers ahead of the replica")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("--update-bytes", update_bytes,
                 "price every transfer as an update of this many bytes, as a larger model would send; the "
                 "gradient trained on stays the --model's (default: the model's own size)");
  app.add_option("--model", model_name, "softmax or mlp")->check(CLI::IsMember({"softmax", "mlp"}));
  app.add_option("--batch", t.batch, "minibatch per gradient")->check(CLI::Range(std::size_t{1}, std::size_t{4096}));
  app.add_option("--eval-every-ms", t.eval_every_ms, "evaluation cadence (simulated ms)")->check(CLI::PositiveNumber);
  app.add_option("--duration-ms", t.duration_ms, "simulated time")->check(CLI::PositiveNumber);
  app.add_option("--target", t.target, "target accuracy for time-to-accuracy")->check(CLI::Range(0.0, 1.0));
  app.add_flag("--stop-at-target", t.stop_at_target, "stop at the first evaluation at or above the target");
  app.add_option("--stop-after-sustained", t.stop_after_sustained,
                 "stop once an evaluation at or above the target is followed by N more at or above it");
  app.add_option("--eval", eval, "test (full 10k test set) or validation (train rows past --train-rows)")
      ->check(CLI::IsMember({"test", "validation"}));
  app.add_option("--train-rows", train_rows, "rows of the training set used to train")->check(CLI::Range(1000, 59000));
  app.add_option("--seed", c.seed, "seed of the cluster (compute times, links) and the data order");
  app.add_option("--data-dir", data_dir, "Fashion-MNIST IDX files (Debian's dataset-fashion-mnist)");
  app.add_option("--json", json_path, "write the run (config, curve, summary) as JSON here");
  app.add_option("--csv", csv_path, "write the accuracy curve as CSV here");
  app.add_flag("--quiet", quiet, "no progress line");
  CLI11_PARSE(app, argc, argv);

  c.mode = sim::parse_mode(mode);
  c.tree_phases = tree_phases == "overlapped" ? sim::TreePhases::overlapped : sim::TreePhases::sequential;
  c.tree_shape = sim::parse_tree_shape(tree_shape);
  c.measure_links_at_round_end = measure_links == "end";
  c.network = sim::parse_network_model(network);
  c.pulls = sim::parse_pull_cost(pulls);
  c.ingress = sim::parse_ingress_sharing(ingress);
  c.aggregation = !no_aggregation;
  if (tau < 0) tau = default_tau(c.workers);
  if (backup_workers < 0) backup_workers = default_backup_workers(c.workers);
  c.backup_workers = static_cast<std::uint32_t>(std::min<std::int64_t>(backup_workers, c.workers));
  if (skip < 0) skip = sim::skips_slowest(c.mode) ? default_backup_workers(c.workers) : 0;
  c.skip_slowest = static_cast<std::uint32_t>(std::min<std::int64_t>(skip, c.workers));
  c.probe_bytes = sim::skips_slowest(c.mode) ? probe_bytes : 0;
  c.tau = tau == 0 ? std::nullopt : std::optional<std::uint32_t>(static_cast<std::uint32_t>(tau));
  t.seed = c.seed;
  if (const auto bad = c.validate()) {
    fmt::print(stderr, "gradlane_train_sim: {}\n", *bad);
    return 2;
  }
  train::ModelSpec spec;
  spec.kind = train::parse_model_kind(model_name);
  const train::Model model(spec);
  const Bytes model_bytes = model.parameters() * sizeof(float);
  c.bytes = update_bytes > 0 ? update_bytes : model_bytes;  // default: the real update, the whole gradient

  const train::FashionMnist data = train::load_fashion_mnist(data_dir);
  const train::Dataset train_set = data.train.slice(0, train_rows);
  const train::Dataset eval_set =
      eval == "test" ? data.test : data.train.slice(train_rows, data.train.rows - train_rows);

  const sim::TrainResult r = sim::train_in_simulation(c, t, model, train_set, eval_set, print_progress, &quiet);
  if (!quiet) std::fprintf(stderr, "\n");

  const auto& s = r.stats;
  const double seconds = r.curve.back().t_ms / 1e3;
  const bool packs = sim::uses_gradlane_grants(c.mode) && c.network == sim::NetworkModel::fair;
  fmt::print("{} lr {} tau {} aggregation {} | {} workers, server {} Gb/s, {} B updates, {} network{}, seed {}\n", mode,
             t.learning_rate, tau == 0 ? std::string("unbounded") : std::to_string(tau), c.aggregation ? "on" : "off",
             c.workers, c.server_gbps, c.bytes, network, packs ? fmt::format(" ({} ingress)", ingress) : std::string(),
             c.seed);
  if (c.mode == sim::Mode::backup)
    fmt::print("  backup workers {}: steps {}, abandoned {}\n", c.backup_workers, s.steps, s.abandoned);
  if (c.mode == sim::Mode::ssp)
    fmt::print("  ssp bound {}: waits {}, max clock lead {}\n", c.ssp_bound, s.ssp_waits, s.max_clock_lead);
  if (c.mode == sim::Mode::sync) fmt::print("  steps {}\n", s.steps);
  if (sim::allreduces(c.mode)) {
    const bool adapts = c.mode == sim::Mode::gradlane_tree && c.tree_shape == sim::TreeShape::adaptive;
    fmt::print(
        "  {} hop {} us: steps {}{}{}\n", sim::reduces_by_tree(c.mode) ? "tree" : "ring", c.ring_hop_us, s.steps,
        c.skip_slowest > 0 ? fmt::format(", not waiting for the {} slowest links", c.skip_slowest) : std::string(),
        adapts ? fmt::format(", {} of them by ring", s.rounds_by_ring) : std::string());
  }
  if (sim::averages_models(c.mode)) fmt::print("  local steps {}: averages {}\n", c.local_steps, s.steps);
  if (c.bytes != model_bytes)
    fmt::print("  transfers priced as {} B updates (the model's gradient is {} B)\n", c.bytes, model_bytes);
  if (t.data_shards) fmt::print("  data shards: on\n");
  fmt::print("  time to {:.0f}%: {}  best accuracy {:.4f}  final {:.4f}\n", t.target * 100,
             r.time_to_target_ms ? fmt::format("{:.0f} ms", *r.time_to_target_ms) : std::string("not reached"),
             r.best_accuracy, r.curve.back().accuracy);
  fmt::print("  gradients applied {} ({:.0f}/s simulated), versions {}, drops {}, aggregates {} ({} gradients)\n",
             r.curve.back().gradients, static_cast<double>(r.curve.back().gradients) / seconds, s.server_slots, s.drops,
             s.aggregates, s.aggregated);
  const double byte_utilisation = sim::server_ingress_byte_utilisation(c, s, seconds * 1e3);
  fmt::print("  delay in versions p50 {} p99 {}; in gradients p50 {} p99 {}\n", percentile(s.delays, 0.5),
             percentile(s.delays, 0.99), percentile(r.gradient_delays, 0.5), percentile(r.gradient_delays, 0.99));
  fmt::print("  server ingress busy {:.1f} %, carried {:.1f} % of its line rate ({:.1f} MB)\n",
             100.0 * s.server_busy_ms / (seconds * 1e3 * c.servers), 100.0 * byte_utilisation,
             static_cast<double>(s.server_ingress_bytes) / 1e6);
  if (s.pulls > 0) {
    fmt::print("  pulls {} ({:.1f} MB out of the server's egress, {:.1f} % of its line rate)\n", s.pulls,
               static_cast<double>(s.server_egress_bytes) / 1e6,
               100.0 * static_cast<double>(s.server_egress_bytes) / (c.server_gbps * 1e9 / 8 * c.servers * seconds));
  }
  fmt::print("  wall {:.1f} s; schedule() calls {}, peak pending aggregates {}\n", r.wall_s, s.schedule_calls,
             s.peak_pending_aggregates);

  if (!json_path.empty()) {
    nlohmann::json j;
    j["config"] = {{"mode", mode},
                   {"network", network},
                   {"pulls", c.network == sim::NetworkModel::exclusive ? "free" : pulls},  // always free there
                   {"ingress", ingress},
                   {"lr", t.learning_rate},
                   {"tau", tau},
                   {"aggregation", c.aggregation},
                   {"backup_workers", c.backup_workers},
                   {"ssp_bound", c.ssp_bound},
                   {"ring_hop_us", c.ring_hop_us},
                   {"local_steps", c.local_steps},
                   {"skip_slowest", c.skip_slowest},
                   {"tree_phases", tree_phases},
                   {"tree_shape", tree_shape},
                   {"measure_links", measure_links},
                   {"probe_bytes", c.probe_bytes},
                   {"data_shards", t.data_shards},
                   {"workers", c.workers},
                   {"compute_ms", c.compute_ms},
                   {"jitter", c.jitter},
                   {"worker_gbps", c.worker_gbps},
                   {"server_gbps", c.server_gbps},
                   {"spread", c.spread},
                   {"change_ms", c.change_ms},
                   {"change_fraction", c.change_fraction},
                   {"stragglers", c.stragglers},
                   {"straggler_slowdown", c.straggler_slowdown},
                   {"replica_bound", c.replica_bound},
                   {"bytes", c.bytes},
                   {"model_bytes", model_bytes},
                   {"model", model_name},
                   {"batch", t.batch},
                   {"eval", eval},
                   {"train_rows", train_rows},
                   {"eval_rows", eval_set.rows},
                   {"eval_every_ms", t.eval_every_ms},
                   {"duration_ms", t.duration_ms},
                   {"target", t.target},
                   {"stop_at_target", t.stop_at_target},
                   {"stop_after_sustained",
                    t.stop_after_sustained ? nlohmann::json(*t.stop_after_sustained) : nlohmann::json(nullptr)},
                   {"seed", c.seed}};
    nlohmann::json curve = nlohmann::json::array();
    for (const auto& e : r.curve) {
      curve.push_back({{"t_ms", e.t_ms},
                       {"accuracy", e.accuracy},
                       {"gradients", e.gradients},
                       {"updates", e.updates},
                       {"drops", e.drops},
                       {"server_ingress_bytes", e.server_ingress_bytes},
                       {"wall_s", e.wall_s}});
    }
    j["curve"] = curve;
    j["summary"] = {
        {"time_to_target_ms", r.time_to_target_ms ? nlohmann::json(*r.time_to_target_ms) : nlohmann::json(nullptr)},
        {"ingress_bytes_at_target",
         r.ingress_bytes_at_target ? nlohmann::json(*r.ingress_bytes_at_target) : nlohmann::json(nullptr)},
        {"best_accuracy", r.best_accuracy},
        {"final_accuracy", r.curve.back().accuracy},
        {"simulated_ms", r.curve.back().t_ms},
        {"submitted", s.submitted},
        {"applied", s.applied},
        {"versions", s.server_slots},
        {"drops", s.drops},
        {"aggregates", s.aggregates},
        {"aggregated", s.aggregated},
        {"steps", s.steps},
        {"abandoned", s.abandoned},
        {"ssp_waits", s.ssp_waits},
        {"max_clock_lead", s.max_clock_lead},
        {"server_ingress_bytes", s.server_ingress_bytes},
        {"server_egress_bytes", s.server_egress_bytes},
        {"pulls", s.pulls},
        {"server_busy_share", s.server_busy_ms / (seconds * 1e3 * c.servers)},
        {"server_byte_utilisation", byte_utilisation},
        {"delay_versions_p50", percentile(s.delays, 0.5)},
        {"delay_versions_p99", percentile(s.delays, 0.99)},
        {"delay_gradients_p50", percentile(r.gradient_delays, 0.5)},
        {"delay_gradients_p99", percentile(r.gradient_delays, 0.99)},
        {"straggler_applied", s.straggler_applied},
        {"straggler_drops", s.straggler_drops},
        {"rounds_by_ring", s.rounds_by_ring},
        {"schedule_calls", s.schedule_calls},
        {"peak_pending_aggregates", s.peak_pending_aggregates},
        {"wall_s", r.wall_s}};
    std::ofstream(json_path) << j.dump(1) << "\n";
  }
  if (!csv_path.empty()) {
    std::ofstream csv(csv_path);
    csv << "t_ms,accuracy,gradients,updates,drops,server_ingress_bytes\n";
    for (const auto& e : r.curve) {
      csv << e.t_ms << ',' << e.accuracy << ',' << e.gradients << ',' << e.updates << ',' << e.drops << ','
          << e.server_ingress_bytes << '\n';
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gradlane_train_sim: %s\n", e.what());
  return 1;
}
