// gradlane_train's configuration: one process per role, all given the same run parameters.
#pragma once

#include <cstdint>
#include <string>

#include "gradlane/options.hpp"

namespace gradlane::trainer {

// How updates reach the server:
//   gradlane  through the hosts' gradlaned: shortest-first ordering, staleness bound τ (drops),
//             replica window — the sidecar owns the sequence;
//   fifo      the plain asynchronous parameter server: every update pushed at once, applied
//             in request order (same transport, same batch, same model);
//   sync      synchronous SGD: a barrier per step (each worker waits until the server holds all
//             N gradients of the previous step), the server averages the N gradients.
//             With an aggregator (gradlaned --aggregator), the sidecar also redirects updates
//             that would wait for the busy server to it, and it forwards their sum.
//   aggregate fifo's direct pushes, but to a ps::Aggregator on a worker host, which sums each
//             group of `group` gradients and forwards one update to the server and replica
//             (MLfabric's R1: the server's ingress carries one update per group), in direct
//             mode: fixed groups, no ordering and no τ.
//   backup    synchronous SGD with `backup` backup workers (Chen et al.): sync's barrier, but a
//             step is the mean of the first workers − backup gradients that reach the server
//             (ps::ShardOptions::round); a later one is dropped unwritten, and its worker joins
//             the next step. A straggler no longer holds every step.
//   ssp       stale-synchronous parallel with bound s (Ho et al.): fifo's pushes, but a worker
//             starts step k only once the slowest worker completed k − s steps (the server
//             keeps each worker's clock, ps::ShardOptions::clock_workers).
enum class Mode : std::uint8_t { gradlane, fifo, sync, aggregate, backup, ssp };
Mode parse_mode(const std::string& name);
const char* to_string(Mode mode);

struct Config {
  std::string role;  // server | replica | worker | aggregator | evaluate
  Mode mode = Mode::fifo;
  std::string model = "softmax";          // softmax | mlp
  std::string data;                       // Fashion-MNIST directory ("" = Debian's)
  std::string device;                     // RDMA device (server, replica, worker)
  std::uint16_t port = 7800;              // server / replica: listen here
  std::string server;                     // worker: ADDR:PORT of the server
  std::string replica;                    // server, worker: ADDR:PORT of the replica ("" = none)
  std::string join;                       // replica: ADDR:PORT of a running server to join as its new
                                          // replica (ShardServer::join_server; "" = accept a primary)
  std::string name;                       // server, replica: the prefix of its files ("" = the role)
  bool grant_windows = false;             // server, replica: ps::ShardOptions::grant_windows
  TransportOptions transport;             // every role but evaluate: TransportOptions::from_env (the job key)
  std::string metrics;                    // every role but evaluate: ADDRESS:PORT of its Prometheus metrics
  bool replica_reads = false;             // workers do not mirror; the replica READs each update from
                                          // the server's slot (give it to the replica and the workers)
  std::uint32_t workers = 2;              // the job's workers
  std::uint32_t backup = 1;               // backup mode: workers whose gradients a step can do
                                          // without (a step averages workers − backup)
  std::uint64_t ssp_bound = 3;            // ssp mode: s, the steps a worker may be ahead of the slowest
  std::uint32_t peers = 0;                // server, replica: connections to accept (0: workers);
                                          // aggregator: its members (0: workers)
  std::string aggregator;                 // worker: ADDR:PORT of its aggregator ("" = none)
  std::uint32_t aggregator_endpoint = 0;  // gradlane mode (worker): the aggregator's endpoint id
  std::uint32_t group = 4;                // aggregator: gradients summed into one update
  std::uint32_t id = 1;                   // worker id, 1..workers
  std::uint64_t steps = 200;              // gradients each worker computes
  bool rejoin = false;                    // aggregator: restarted; the workers that lost it come back
  std::uint64_t first_step = 0;           // a restarted worker resumes here (steps first_step .. steps-1)
  std::uint32_t rejoin_grace_s = 30;      // server, replica: after losing a worker, this long before
                                          // the job may end with none left (it may rejoin)
  std::uint32_t rejoin_within_s = 30;     // worker, aggregator: one that lost server and replica (a
                                          // link down) rejoins the running job for this long (0: exits)
  float learning_rate = 0.1F;             // per gradient (sync: per averaged step)
  std::uint32_t batch = 64;
  bool shard = false;                 // worker: draw only from its own partition of the training rows (1 of
                                      // `workers`), not from all of them in its own order
  std::uint64_t seed = 1;             // model initialisation and every worker's data order
  std::uint32_t slots = 8;            // the server's update slots (also the replica window)
  std::string sidecar;                // gradlane mode: the host's gradlaned segment
  std::uint32_t endpoint = 0;         // gradlane mode: this process's NIC endpoint id
  std::uint32_t server_endpoint = 0;  // gradlane mode (worker): the server's endpoint id
  std::uint32_t job = 1;              // gradlane mode: the job (tenant) id every role attaches as
  bool declare_remaining = true;      // gradlane mode (worker): tell gradlaned the job's work left
                                      // with each push (steps left × update bytes × workers)
  std::string out = ".";              // where each role writes its files
  std::uint32_t snapshot_ms = 250;    // server: the model is recorded this often
  std::uint32_t live_eval = 500;      // server: test images behind the live accuracy (0: none)
  double target = 0.80;               // evaluate: the accuracy whose time is reported
  std::string split = "test";         // evaluate: test (10,000 images) or validation (the last
                                      // 10,000 training images, which workers never train on)
};

// sync and backup: every step waits for its gradients (the others push asynchronously).
inline bool is_synchronous(Mode mode) { return mode == Mode::sync || mode == Mode::backup; }

// sync and backup: the gradients one step averages.
inline std::uint32_t gradients_per_step(const Config& c) {
  return c.mode == Mode::backup ? c.workers - c.backup : c.workers;
}

int run_server(const Config& config);  // server and replica
int run_worker(const Config& config);
int run_aggregator(const Config& config);
int run_evaluate(const Config& config);  // offline: the server's snapshots on the test set

}  // namespace gradlane::trainer
