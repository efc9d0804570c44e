// Load (issue 10, item 6) over real rxe: one shard server with 32 worker connections, and its
// replica. Everything is a thread of this process (one exec under TCG instead of 34): the
// server on host 0's device, the replica on host 1's, 16 workers on each of hosts 1 and 2,
// every thread with its own Device, as separate processes would have.
//
// Checked, byte for byte:
//   - every push a worker saw acknowledged (neither lost nor dropped) is in the server's
//     history exactly once, at the sequence its grant named, as that (worker, step);
//   - every sequence was decided once, in order, none skipped, none from nowhere;
//   - the server's model is the reference (the initial shard with the applied gradients, in
//     the server's order, through the same kernel), and the replica's is bitwise the same.
// Printed, not asserted: the process's peak RSS (VmHWM: server, replica and all 32 workers
// together), and the server's updates/s with 32 workers against a 1-worker run of as many updates.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradlane/gradlane.hpp"

#include "../common/hosts.hpp"
#include "examples/ps_synthetic.hpp"
#include "transport/ps/kernels.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kWorkers = 32;
constexpr std::uint64_t kPushes = 12;    // per worker
constexpr std::size_t kFloats = 1024;    // 4 KiB updates: the connections are the load, not the bytes
constexpr std::uint16_t kServerPort = 7820;  // the replica listens on the next port

std::vector<float> initial_model() {
  std::vector<float> model(kFloats);
  for (std::size_t j = 0; j < kFloats; ++j) model[j] = examples::initial_value(j);
  return model;
}

std::string peak_rss() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return line.substr(6);
  }
  return "?";
}

struct Acked {
  std::uint32_t worker = 0;
  std::uint64_t step = 0;
};

struct ShardResult {
  std::vector<ps::AppliedUpdate> history;
  std::vector<float> model;
  ps::ServerStats stats;
  double seconds = 0;  // from every worker connected to the last update decided
  std::string failure;
};

// One run: a server and its replica, `workers` workers each pushing `pushes` updates.
struct LoadRun {
  ShardResult server, replica;
  std::vector<std::map<std::uint64_t, Acked>> acked;  // per worker: sequence -> push
  std::vector<std::string> worker_failures;
  double rate() const { return static_cast<double>(server.history.size()) / std::max(server.seconds, 1e-9); }
};

LoadRun run_load(const std::vector<Host>& hosts, std::uint32_t workers, std::uint64_t pushes, std::uint16_t port,
                 std::uint32_t shared_receives = 0) {
  const std::uint64_t total = workers * pushes;
  const std::uint16_t replica_port = port + 1;
  ps::ShardOptions shard;
  shard.floats = kFloats;
  shard.slots = 8;
  shard.learning_rate = examples::kLearningRate;
  shard.block_when_idle = true;  // 34 threads on 2 vCPUs: the idle ones must not spin
  shard.shared_receives = shared_receives;

  // The shard servers run until every update is decided (or a bound that only a hang reaches).
  // The server then keeps serving until the replica is done too: its clean exit would otherwise
  // promote a replica that is still applying (its destructor waits only 5 s for the replica's
  // acks, and a CPU-starved VM once took longer: the replica promoted and ended with another
  // model; see perf/results/sidecar-load.md).
  std::atomic<bool> replica_done{false};
  const auto serve = [&](ps::Role role, const Host& host, ShardResult& out) {
    try {
      Device device = Device::open({.name = host.device});
      ps::ShardServer server(device, role, role == ps::Role::server ? port : replica_port, shard, initial_model());
      if (role == ps::Role::server) server.connect_replica(hosts[1].address, replica_port, 120s);
      server.accept_peers(workers, 120s);
      const auto start = std::chrono::steady_clock::now();
      if (!server.run_until(total, 300s)) out.failure = "timed out at version " + std::to_string(server.version());
      out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      out.history = server.history();
      out.model.assign(server.model().begin(), server.model().end());
      out.stats = server.stats();
      const auto give_up = std::chrono::steady_clock::now() + 120s;
      while (role == ps::Role::server && !replica_done.load() && std::chrono::steady_clock::now() < give_up) {
        if (server.progress() == 0) server.wait_for_input(20ms);
      }
    } catch (const std::exception& e) {
      out.failure = e.what();
    }
    if (role == ps::Role::replica) replica_done.store(true);
  };
  LoadRun run;
  run.acked.resize(workers);
  run.worker_failures.resize(workers);
  {
    std::jthread replica_thread(serve, ps::Role::replica, hosts[1], std::ref(run.replica));
    std::jthread server_thread(serve, ps::Role::server, hosts[0], std::ref(run.server));
    std::vector<std::jthread> threads;
    for (std::uint32_t w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        const std::uint32_t id = w + 1;
        try {
          Device device = Device::open({.name = hosts[1 + w % 2].device});
          ps::WorkerOptions o;
          o.id = id;
          o.server = {hosts[0].address, port};
          o.replica = ps::Endpoint{hosts[1].address, replica_port};
          o.floats = kFloats;
          o.timeout = 120s;
          ps::Worker worker(device, o);
          for (std::uint64_t step = 0; step < pushes; ++step) {
            const std::span<float> g = worker.gradient();
            for (std::size_t j = 0; j < g.size(); ++j) g[j] = examples::gradient_value(id, step, j, false);
            const ps::PushResult r = worker.push(/*computed_on=*/0, step);
            if (!r.lost && !r.dropped) run.acked[w][r.sequence] = Acked{id, step};
          }
        } catch (const std::exception& e) {
          run.worker_failures[w] = e.what();
        }
      });
    }
  }
  return run;
}

// Every acknowledged push applied once at its sequence; the model is the reference, bitwise.
void check(const LoadRun& run, std::uint32_t workers, std::uint64_t pushes) {
  const std::uint64_t total = workers * pushes;
  const ShardResult& server = run.server;
  const ShardResult& replica = run.replica;
  for (std::uint32_t w = 0; w < workers; ++w) EXPECT_EQ(run.worker_failures[w], "") << "worker " << w + 1;
  ASSERT_EQ(server.failure, "");
  ASSERT_EQ(replica.failure, "");

  // Every sequence decided once, in order, none skipped; every (worker, step) applied once.
  ASSERT_EQ(server.history.size(), total);
  std::set<std::pair<std::uint32_t, std::uint64_t>> applied;
  for (std::size_t i = 0; i < server.history.size(); ++i) {
    const ps::AppliedUpdate& u = server.history[i];
    EXPECT_EQ(u.sequence, i + 1) << "decided out of sequence order";
    EXPECT_FALSE(u.skipped) << "sequence " << u.sequence;
    EXPECT_TRUE(u.worker >= 1 && u.worker <= workers && u.tag < pushes) << "sequence " << u.sequence;
    EXPECT_TRUE(applied.insert({u.worker, u.tag}).second) << "worker " << u.worker << " step " << u.tag << " twice";
  }
  // Every acknowledged push is the update applied at the sequence it was granted.
  std::uint64_t acknowledged = 0;
  for (const auto& by_sequence : run.acked) {
    for (const auto& [sequence, push] : by_sequence) {
      ++acknowledged;
      ASSERT_TRUE(sequence >= 1 && sequence <= server.history.size()) << "acknowledged sequence " << sequence;
      const ps::AppliedUpdate& u = server.history[sequence - 1];
      EXPECT_TRUE(u.worker == push.worker && u.tag == push.step)
          << "sequence " << sequence << " was acknowledged to worker " << push.worker << " step " << push.step
          << " but applied as worker " << u.worker << " step " << u.tag;
    }
  }
  EXPECT_EQ(acknowledged, total) << "direct mode loses nothing without a fault";
  EXPECT_EQ(server.stats.peers_lost, 0U);

  // The model, byte for byte.
  std::vector<float> reference = initial_model(), gradient(kFloats);
  for (const ps::AppliedUpdate& u : server.history) {
    for (std::size_t j = 0; j < kFloats; ++j) gradient[j] = examples::gradient_value(u.worker, u.tag, j, false);
    ps::sgd_step(reference, gradient, examples::kLearningRate);
  }
  ASSERT_EQ(server.model.size(), kFloats);
  EXPECT_EQ(std::memcmp(server.model.data(), reference.data(), kFloats * sizeof(float)), 0)
      << "the server's model is not its history applied";
  ASSERT_EQ(replica.model.size(), kFloats);
  EXPECT_EQ(std::memcmp(replica.model.data(), server.model.data(), kFloats * sizeof(float)), 0)
      << "server and replica diverged";
  EXPECT_NE(server.model[0], examples::initial_value(0));
}

TEST(ManyWorkers, ServerWith32WorkerConnectionsAppliesEveryAcknowledgedPushOnce) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  // The baseline first: one worker pushing as many updates as 32 workers push in all, so both
  // runs last long enough to time. Measured, not asserted (the VM's speed varies).
  const LoadRun one = run_load(hosts, 1, kWorkers * kPushes, 7822);
  check(one, 1, kWorkers * kPushes);
  const LoadRun many = run_load(hosts, kWorkers, kPushes, kServerPort);
  check(many, kWorkers, kPushes);
  std::printf("peak RSS of this process (server, replica, %u workers): %s\n", kWorkers, peak_rss().c_str());
  std::printf("server: 1 worker %.1f updates/s, %u workers %.1f updates/s: %.2f of the 1-worker rate\n", one.rate(),
              kWorkers, many.rate(), many.rate() / one.rate());
  RecordProperty("updates_per_s_1_worker", std::to_string(one.rate()));
  RecordProperty("updates_per_s_32_workers", std::to_string(many.rate()));
}

TEST(ManyWorkers, OnSharedReceiveQueuesTheSame32WorkersLoseNothing) {
  // The server and the replica draw every connection's receives from one shared queue of 64
  // buffers (2 per worker) instead of 128 per connection: doorbells, requests and byes of 32
  // workers share them, and every acknowledged push must still be applied once, in order.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  const LoadRun many = run_load(hosts, kWorkers, kPushes, kServerPort + 10, /*shared_receives=*/64);
  check(many, kWorkers, kPushes);
  std::printf("server on 64 shared receives: %u workers %.1f updates/s\n", kWorkers, many.rate());
}

}  // namespace
}  // namespace gradlane::testing
