// gradlane_train: asynchronous (or synchronous) data-parallel SGD on Fashion-MNIST over
// gradlane's parameter server. One process per role; trainer/train.sh starts a whole job
// on the Soft-RoCE hosts. See docs/training.md.
//
//   gradlane_train server  --mode M --device rxe0 --port 7800 --workers N [--replica A:P] --out DIR
//   gradlane_train replica --mode M --device rxe1 --port 7801 --workers N --out DIR
//   gradlane_train worker  --mode M --device rxe2 --id I --server A:P [--replica A:P] --steps K --out DIR
//   gradlane_train aggregator --mode aggregate --device rxe2 --port 7802 --id I --server A:P [--replica A:P] --group K
//   gradlane_train evaluate --out DIR            (the server's snapshots on the full test set)
// backup mode gives every role --backup B: each step averages the first --workers minus B gradients.
// gradlane mode adds --sidecar SHM --endpoint E (and --server-endpoint E on workers); aggregate
// mode gives workers --aggregator A:P and the server and replica --peers (the aggregators).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "config.hpp"

namespace gradlane::trainer {

Mode parse_mode(const std::string& name) {
  if (name == "gradlane") return Mode::gradlane;
  if (name == "fifo") return Mode::fifo;
  if (name == "sync") return Mode::sync;
  if (name == "aggregate") return Mode::aggregate;
  if (name == "backup") return Mode::backup;
  if (name == "ssp") return Mode::ssp;
  throw std::invalid_argument("unknown mode '" + name + "': use gradlane, fifo, sync, aggregate, backup or ssp");
}

const char* to_string(Mode mode) {
  switch (mode) {
    case Mode::gradlane:
      return "gradlane";
    case Mode::fifo:
      return "fifo";
    case Mode::sync:
      return "sync";
    case Mode::aggregate:
      return "aggregate";
    case Mode::backup:
      return "backup";
    case Mode::ssp:
      return "ssp";
  }
  return "?";
}

}  // namespace gradlane::trainer

int main(int argc, char** argv) {
  using gradlane::trainer::Config;
  Config c;
  std::string mode = "fifo";
  CLI::App app{"gradlane_train: data-parallel SGD on Fashion-MNIST over gradlane's parameter server"};
  app.require_subcommand(1);
  const auto metrics = [&](CLI::App* sub) {
    sub->add_option("--metrics", c.metrics,
                    "ADDRESS:PORT to serve the role's Prometheus metrics on (GET /metrics); written to "
                    "<out>/<name>.metrics.prom at its end");
  };
  const auto common = [&](CLI::App* sub) {
    sub->add_option("--mode", mode, "gradlane | fifo | sync | aggregate | backup | ssp")
        ->check(CLI::IsMember({"gradlane", "fifo", "sync", "aggregate", "backup", "ssp"}));
    sub->add_option("--ssp-bound", c.ssp_bound,
                    "ssp mode: a worker starts step k once the slowest worker completed k minus this many steps")
        ->check(CLI::Range(0ULL, 1000000ULL));
    sub->add_option("--backup", c.backup,
                    "backup mode: backup workers; each step averages the first --workers minus this many gradients "
                    "and drops the rest unsent");
    sub->add_option("--model", c.model, "softmax | mlp")->check(CLI::IsMember({"softmax", "mlp"}));
    sub->add_option("--data", c.data, "Fashion-MNIST directory (default: Debian's dataset-fashion-mnist)");
    sub->add_option("--out", c.out, "directory for this role's files");
    sub->add_option("--workers", c.workers, "workers in the job")->check(CLI::Range(1U, 1024U));
    sub->add_option("--lr", c.learning_rate, "learning rate (sync: of the averaged step)");
    sub->add_option("--seed", c.seed, "model initialisation and data order");
    sub->add_option("--slots", c.slots, "the server's update slots")->check(CLI::Range(1U, 4096U));
    sub->add_option("--sidecar", c.sidecar, "gradlane mode: the host's gradlaned shared-memory name");
    sub->add_option("--endpoint", c.endpoint, "gradlane mode: this process's NIC endpoint id");
    sub->add_option("--job", c.job, "gradlane mode: the job (tenant) id, the same for all of a job's roles")
        ->check(CLI::Range(1U, 1U << 30));
    sub->add_flag("--replica-reads", c.replica_reads,
                  "workers write each update to the server only; the replica READs it from the server's slot");
  };
  for (const char* role : {"server", "replica"}) {
    auto* sub = app.add_subcommand(role, std::string("run the ") + role);
    common(sub);
    sub->add_option("--device", c.device, "RDMA device")->required();
    sub->add_option("--port", c.port, "listen port");
    sub->add_option("--peers", c.peers, "connections to accept (default: --workers; aggregate mode: the aggregators)");
    if (std::string(role) == "server") sub->add_option("--replica", c.replica, "ADDR:PORT of the replica");
    sub->add_option("--rejoin-grace", c.rejoin_grace_s,
                    "seconds after losing a worker (gone without saying it finished) before the job may end with no "
                    "worker left: one cut off by a link that came back rejoins (worker --rejoin-within)")
        ->check(CLI::Range(0U, 3600U));
    sub->add_flag("--grant-windows", c.grant_windows,
                  "open each update slot only to the worker granted it (a memory window per grant, claimed with the "
                  "grant's token where the server did not bind it itself); server and replica alike");
    if (std::string(role) == "replica") {
      sub->add_option("--join", c.join,
                      "ADDR:PORT of a running server (e.g. a promoted replica) to join as its new replica");
    }
    sub->add_option("--name", c.name, "the prefix of its files in --out (default: the role)");
    sub->add_option("--snapshot-ms", c.snapshot_ms, "record the model this often")->check(CLI::Range(10U, 60000U));
    sub->add_option("--live-eval", c.live_eval, "test images behind the live accuracy (0: none)");
    metrics(sub);
    sub->callback([&c, role] { c.role = role; });
  }
  auto* worker = app.add_subcommand("worker", "run a worker");
  common(worker);
  worker->add_option("--device", c.device, "RDMA device")->required();
  worker->add_option("--id", c.id, "worker id (1..workers)")->required()->check(CLI::Range(1U, 1024U));
  worker->add_option("--server", c.server, "ADDR:PORT of the server")->required();
  worker->add_option("--replica", c.replica, "ADDR:PORT of the replica (every update is mirrored there)");
  worker->add_option("--steps", c.steps, "gradients to compute")->check(CLI::Range(1ULL, 100000000ULL));
  worker->add_option("--first-step", c.first_step,
                     "resume at this step: a worker restarted from a checkpoint rejoins the running job (the server "
                     "admits it under its --id) and computes steps first-step .. steps-1");
  worker
      ->add_option("--rejoin-within", c.rejoin_within_s,
                   "seconds a worker that lost its server and its replica (a link down, a peer unreachable) keeps "
                   "trying to rejoin the running job before it exits with the error (0: exit at once)")
      ->check(CLI::Range(0U, 3600U));
  worker->add_option("--batch", c.batch, "minibatch size")->check(CLI::Range(1U, 50000U));
  worker->add_flag("--shard", c.shard,
                   "draw minibatches only from this worker's partition of the training rows (1 of --workers), "
                   "as data-parallel jobs shard their data; default: all rows, in the worker's own order");
  worker->add_option("--server-endpoint", c.server_endpoint, "gradlane mode: the server's endpoint id");
  worker->add_option("--declare-remaining", c.declare_remaining,
                     "gradlane mode: declare the job's work left with each push (true/false; where jobs share a NIC, "
                     "gradlaned serves the one with the least left first)");
  worker->add_option("--aggregator", c.aggregator,
                     "ADDR:PORT of the worker's aggregator (aggregate mode: every push goes there; gradlane mode: "
                     "the updates gradlaned redirects to --aggregator-endpoint)");
  worker->add_option("--aggregator-endpoint", c.aggregator_endpoint, "gradlane mode: the aggregator's endpoint id");
  metrics(worker);
  worker->callback([&c] { c.role = "worker"; });
  auto* aggregator = app.add_subcommand("aggregator",
                                        "run an aggregator (aggregate mode, or gradlane mode: the groups "
                                        "gradlaned forms; attach it with --sidecar and --endpoint)");
  common(aggregator);
  aggregator->add_option("--device", c.device, "RDMA device")->required();
  aggregator->add_option("--port", c.port, "listen port (workers connect here)");
  aggregator->add_option("--id", c.id, "its worker id at the server (distinct from the workers')")
      ->required()
      ->check(CLI::Range(1U, 1U << 20));
  aggregator->add_option("--server", c.server, "ADDR:PORT of the server")->required();
  aggregator->add_option("--replica", c.replica, "ADDR:PORT of the replica (the aggregate is mirrored there)");
  aggregator->add_option("--group", c.group, "gradients summed into one update")->check(CLI::Range(1U, 1024U));
  aggregator->add_option("--peers", c.peers, "workers that push to it (default: --workers)");
  aggregator->add_flag("--grant-windows", c.grant_windows,
                       "gradlane mode: each worker may write only its own partition of the member ring (a memory "
                       "window per connection)");
  aggregator->add_flag("--rejoin", c.rejoin,
                       "a restarted aggregator: wait for no worker at the start; the ones that lost it come back "
                       "(direct aggregate mode)");
  aggregator
      ->add_option("--rejoin-within", c.rejoin_within_s,
                   "direct aggregate mode: seconds its forward, having lost the server and the replica (a link "
                   "down), keeps trying to connect to the running job again before it fails (0: fail at once)")
      ->check(CLI::Range(0U, 3600U));
  metrics(aggregator);
  aggregator->callback([&c] { c.role = "aggregator"; });
  auto* evaluate = app.add_subcommand("evaluate", "evaluate the server's snapshots on the test set");
  common(evaluate);
  evaluate->add_option("--target", c.target, "accuracy whose time is reported")->check(CLI::Range(0.0, 1.0));
  evaluate
      ->add_option("--split", c.split,
                   "test, or validation: the last 10,000 training images, which workers never train on (learning "
                   "rates are chosen on it)")
      ->check(CLI::IsMember({"test", "validation"}));
  evaluate->callback([&c] { c.role = "evaluate"; });
  CLI11_PARSE(app, argc, argv);
  try {
    c.mode = gradlane::trainer::parse_mode(mode);
    if (c.mode == gradlane::trainer::Mode::gradlane &&
        (c.role == "server" || c.role == "worker" || c.role == "aggregator") && c.sidecar.empty()) {
      throw std::invalid_argument("--mode gradlane needs --sidecar SHM_NAME (the host's gradlaned) and --endpoint");
    }
    if (c.mode == gradlane::trainer::Mode::backup && c.backup >= c.workers) {
      throw std::invalid_argument(
          "--mode backup needs --backup below --workers (a step averages workers - backup "
          "gradients); got --backup " +
          std::to_string(c.backup) + " of --workers " + std::to_string(c.workers));
    }
    if (c.mode == gradlane::trainer::Mode::aggregate && c.role == "worker" && c.aggregator.empty()) {
      throw std::invalid_argument("--mode aggregate needs --aggregator ADDR:PORT on each worker");
    }
    // Before anything is loaded: a role without the job's key refuses to start (GRADLANE_INSECURE=1 overrides).
    if (c.role != "evaluate") c.transport = gradlane::TransportOptions::from_env();
    if (c.role == "worker") return gradlane::trainer::run_worker(c);
    if (c.role == "aggregator") return gradlane::trainer::run_aggregator(c);
    if (c.role == "evaluate") return gradlane::trainer::run_evaluate(c);
    return gradlane::trainer::run_server(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradlane_train %s: %s\n", c.role.c_str(), e.what());
    return 1;
  }
}
