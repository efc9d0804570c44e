// gradlane_sched_sim: a discrete-event simulation of asynchronous parameter-server training
// driven through the scheduling core, comparing a FIFO parameter server with MLfabric's
// ordering (network-aware SJF + staleness bound tau + aggregation).
//
// The model of workers, links and the server is cluster.hpp's (shared with gradlane_train_sim,
// which trains a real model on the same traffic); by default every worker runs at its declared
// rate but the straggler, whose egress is --straggler-slowdown times slower than declared
// (--spread makes every worker's egress uneven, --change-ms redraws it now and then).
// --network picks how NICs carry concurrent transfers (fair sharing by default, or one at a
// time); "server ingress busy" is the time it carried anything, "bytes carried" the share of
// its line rate actually used.
// Delay of an applied gradient = (server version it is applied to) - (version computed on),
// counted per gradient (each member of an aggregate counts).
//
// Reading the results. With n asynchronous workers every update is about n versions stale
// under FIFO (everyone else's update lands while it computes). MLfabric bounds that at tau by
// dropping what cannot make it, and fewer versions are spent per gradient when the server is
// backlogged, because waiting updates are summed. The defaults put the server at about twice
// its capacity (1000 x 1 MiB every 45 ms into 100 Gb/s) with tau = n/2: the regime MLfabric is
// for. With tau far below the natural delay and no backlog, the bound mostly drops (it throttles
// the server to ~tau versions per compute step), which the table shows as drops; a convergence
// model, not this simulator, decides whether that is worth it.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "perf/sched/cluster.hpp"

namespace {

struct Result : gradlane::sched::sim::ClusterStats {
  std::string name;
};

Result run(gradlane::sched::sim::ClusterParams p, gradlane::sched::sim::Mode mode, double duration_ms) {
  using namespace gradlane::sched;
  p.mode = mode;
  sim::Cluster cluster(p);
  cluster.run_until(Instant{Nanos{static_cast<std::int64_t>(duration_ms * 1e6)}});
  Result r;
  static_cast<sim::ClusterStats&>(r) = cluster.stats();
  r.name = mode == sim::Mode::fifo ? "FIFO" : "MLfabric";
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradlane::sched;
  sim::ClusterParams p;  // its defaults are this tool's: 1 MiB every 45 ms, 100 Gb/s, 1 straggler
  double duration_ms = 2000.0;
  std::uint32_t tau = 500;
  std::string policy = "both";
  std::string network = sim::to_string(p.network);
  std::string pulls = sim::to_string(p.pulls);
  CLI::App app{"gradlane_sched_sim: FIFO vs MLfabric scheduling of async parameter-server updates"};
  app.add_option("--workers", p.workers, "number of workers")->check(CLI::Range(1u, 100000u));
  app.add_option("--servers", p.servers, "number of servers (worker w pushes to w % servers)")
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--bytes", p.bytes, "update size in bytes")->check(CLI::Range(Bytes{1}, Bytes{1} << 34));
  app.add_option("--compute-ms", p.compute_ms, "mean compute time per step")->check(CLI::PositiveNumber);
  app.add_option("--jitter", p.jitter, "compute time is uniform in mean*(1 +- jitter)")->check(CLI::Range(0.0, 0.99));
  app.add_option("--worker-gbps", p.worker_gbps, "worker NIC line rate")->check(CLI::PositiveNumber);
  app.add_option("--server-gbps", p.server_gbps, "server NIC line rate")->check(CLI::PositiveNumber);
  app.add_option("--stragglers", p.stragglers, "workers with a slowed egress");
  app.add_option("--straggler-slowdown", p.straggler_slowdown, "their egress is this many times slower")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--spread", p.spread, "worker egress log-uniform in [rate/spread, rate]")->check(CLI::Range(1.0, 1e6));
  app.add_option("--change-ms", p.change_ms, "every this often, redraw some workers' egress (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--change-fraction", p.change_fraction, "share of workers redrawn per change")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--duration-ms", duration_ms, "simulated time")->check(CLI::PositiveNumber);
  app.add_option("--tau", tau, "staleness bound for the MLfabric run");
  app.add_option("--replica-bound", p.replica_bound, "B: sequence numbers ahead of the replica")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("--replica-lag-us", p.replica_lag_us, "replica acknowledges this long after apply")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--horizon-us", p.horizon_us, "grant horizon")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", p.seed, "random seed (compute times)");
  app.add_option("--policy", policy, "fifo, mlfabric or both")->check(CLI::IsMember({"fifo", "mlfabric", "both"}));
  app.add_option("--network", network,
                 "fair: each NIC shared max-min fairly by the transfers crossing it; "
                 "exclusive: one transfer at a time per NIC direction")
      ->check(CLI::IsMember({"fair", "exclusive"}));
  app.add_option("--pulls", pulls,
                 "priced: a worker's pull of the model crosses the server's egress and its own ingress before "
                 "it computes (fair network); free: it takes no time")
      ->check(CLI::IsMember({"priced", "free"}));
  CLI11_PARSE(app, argc, argv);
  p.network = sim::parse_network_model(network);
  p.pulls = sim::parse_pull_cost(pulls);
  if (p.stragglers > p.workers) {
    fmt::print(stderr, "--stragglers ({}) cannot exceed --workers ({})\n", p.stragglers, p.workers);
    return 2;
  }

  p.tau = tau;

  std::vector<Result> results;
  if (policy != "mlfabric") results.push_back(run(p, sim::Mode::fifo, duration_ms));
  if (policy != "fifo") results.push_back(run(p, sim::Mode::gradlane, duration_ms));

  fmt::print(
      "gradlane_sched_sim: {} workers -> {} server(s), {:.2f} MiB updates, compute {} ms +-{:.0f}%,\n"
      "  workers {} Gb/s (spread {}, redrawn every {} ms), servers {} Gb/s, {} straggler(s) at 1/{} egress, "
      "tau {}, B {}, "
      "{} ms simulated, seed {}, {} network, pulls {}\n\n",
      p.workers, p.servers, static_cast<double>(p.bytes) / (1 << 20), p.compute_ms, p.jitter * 100, p.worker_gbps,
      p.spread, p.change_ms, p.server_gbps, p.stragglers, p.straggler_slowdown, tau, p.replica_bound, duration_ms,
      p.seed, sim::to_string(p.network), sim::to_string(p.pulls));
  fmt::print("{:<34}", "");
  for (const Result& r : results) fmt::print("{:>14}", r.name);
  fmt::print("\n");
  auto row = [&](const char* label, auto value) {
    fmt::print("{:<34}", label);
    for (const Result& r : results) fmt::print("{:>14}", value(r));
    fmt::print("\n");
  };
  auto percentile = [](std::vector<std::uint64_t> v, double q) -> std::uint64_t {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
  };
  row("updates submitted", [](const Result& r) { return fmt::format("{}", r.submitted); });
  row("gradients applied", [](const Result& r) { return fmt::format("{}", r.applied); });
  row("mean delay (versions)", [](const Result& r) {
    double sum = 0;
    for (auto d : r.delays) sum += static_cast<double>(d);
    return fmt::format("{:.1f}", r.delays.empty() ? 0.0 : sum / static_cast<double>(r.delays.size()));
  });
  row("p99 delay (versions)", [&](const Result& r) { return fmt::format("{}", percentile(r.delays, 0.99)); });
  row("max delay (versions)", [&](const Result& r) { return fmt::format("{}", percentile(r.delays, 1.0)); });
  row("applied with delay <= tau", [&](const Result& r) {
    return fmt::format("{}",
                       std::count_if(r.delays.begin(), r.delays.end(), [&](std::uint64_t d) { return d <= tau; }));
  });
  row("drops (never sent)", [](const Result& r) { return fmt::format("{}", r.drops); });
  row("server slots used", [](const Result& r) { return fmt::format("{}", r.server_slots); });
  row("aggregates (gradients in them)",
      [](const Result& r) { return fmt::format("{} ({})", r.aggregates, r.aggregated); });
  row("gradients applied per second",
      [&](const Result& r) { return fmt::format("{:.0f}", static_cast<double>(r.applied) / (duration_ms / 1e3)); });
  row("mean submit->applied (ms)", [](const Result& r) {
    return fmt::format("{:.2f}", r.applied ? r.latency_sum_ms / static_cast<double>(r.applied) : 0.0);
  });
  row("server ingress busy (%)",
      [&](const Result& r) { return fmt::format("{:.1f}", 100.0 * r.server_busy_ms / (duration_ms * p.servers)); });
  row("server ingress bytes carried (%)", [&](const Result& r) {
    return fmt::format("{:.1f}", 100.0 * sim::server_ingress_byte_utilisation(p, r, duration_ms));
  });
  row("straggler applied / dropped",
      [](const Result& r) { return fmt::format("{} / {}", r.straggler_applied, r.straggler_drops); });
  return 0;
}
