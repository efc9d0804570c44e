// ShardServer::cut_off() over rxe: a server with a replica that loses every worker, none of
// which said it finished, is cut off — even while its idle replica connection still looks alive
// (otherwise the server exits as finished while the replica, promoted, goes on: two final
// models). A worker that says Bye first is a finished job.
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradlane/gradlane.hpp"

#include "../common/hosts.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;

struct Ending {
  bool finished = false;
  bool cut_off = false;
  bool replica_connected = false;  // the replica still connected when it finished
  std::string failure;
};

// A server on host 0 with its replica on host 1 — connected at the start, or (`replica_joins`)
// joining the running server (ShardServer::join_server) — and one hand-driven worker from host 2
// that says hello, then leaves (after a Bye, or without one) once the replica is there. What the
// server says once it has finished.
Ending server_after_its_worker_leaves(const std::vector<Host>& hosts, std::uint16_t port, bool says_bye,
                                      bool replica_joins = false) {
  constexpr std::size_t kFloats = 256;
  const std::uint16_t replica_port = port + 1;
  ps::ShardOptions shard;
  shard.floats = kFloats;
  shard.slots = 8;
  std::atomic<bool> server_done{false}, server_serving{false}, replica_there{false};
  Ending ending;
  std::string replica_failure;
  std::jthread replica_thread([&] {
    try {
      Device device = Device::open({.name = hosts[1].device});
      ps::ShardServer replica(device, ps::Role::replica, replica_port, shard, std::vector<float>(kFloats, 0.0F));
      if (replica_joins) {
        const auto give_up = std::chrono::steady_clock::now() + 60s;
        while (!server_serving.load() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
        replica.join_server(hosts[0].address, port, 60s);
      } else {
        replica.accept_peers(0, 60s);  // just the server
      }
      replica_there = true;
      while (!server_done.load()) {
        if (replica.progress() == 0) replica.wait_for_input(5ms);
      }
    } catch (const std::exception& e) {
      replica_failure = e.what();
    }
  });
  std::jthread server_thread([&] {
    try {
      Device device = Device::open({.name = hosts[0].device});
      ps::ShardServer server(device, ps::Role::server, port, shard, std::vector<float>(kFloats, 0.0F));
      if (!replica_joins) server.connect_replica(hosts[1].address, replica_port, 60s);
      server.accept_peers(1, 60s);
      server_serving = true;
      const auto give_up = std::chrono::steady_clock::now() + 60s;
      while (!server.finished() && std::chrono::steady_clock::now() < give_up) {
        if (server.progress() == 0) server.wait_for_input(5ms);
      }
      ending.finished = server.finished();
      ending.cut_off = server.cut_off();
      ending.replica_connected = server.stats().peers_lost == 1;  // the worker only: the replica still counted alive
    } catch (const std::exception& e) {
      ending.failure = e.what();
    }
    server_done = true;
  });
  try {
    Device device = Device::open({.name = hosts[2].device});
    Connection worker = ps::connect_with_retry(device, hosts[0].address, port, TransportOptions{}, 60s);
    (void)worker.wait_region(ps::kSlotRegionId, 60s);
    worker.send(ps::encode(ps::Hello{ps::PeerKind::worker, 1}));
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    while (!replica_there.load() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
    if (!replica_there.load()) throw Error(Errc::timeout, "the replica never got there");
    if (says_bye) {
      worker.send(ps::encode(ps::Bye{1}));
      worker.flush(5s);
    }
    worker.close();
  } catch (const std::exception& e) {
    ending.failure = std::string("worker: ") + e.what();
  }
  server_thread.join();
  replica_thread.join();
  if (ending.failure.empty() && !replica_failure.empty()) ending.failure = "replica: " + replica_failure;
  return ending;
}

TEST(ShardServerCutOff, EveryWorkerGoneWithoutByeIsACutOffThoughTheIdleReplicaLooksAlive) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  const Ending lost = server_after_its_worker_leaves(hosts, 7870, /*says_bye=*/false);
  ASSERT_EQ(lost.failure, "");
  EXPECT_TRUE(lost.finished);
  EXPECT_TRUE(lost.replica_connected) << "the replica's loss was seen: this test no longer shows the idle-replica case";
  EXPECT_TRUE(lost.cut_off) << "a server whose every worker vanished took itself for finished";

  const Ending left = server_after_its_worker_leaves(hosts, 7872, /*says_bye=*/true);
  ASSERT_EQ(left.failure, "");
  EXPECT_TRUE(left.finished);
  EXPECT_FALSE(left.cut_off) << "a worker that said it finished is not a partition";
}

TEST(ShardServerCutOff, AServerWhoseReplicaJoinedItRunningIsCutOffWhenEveryWorkerVanishes) {
  // The replica that joined a running server (a promoted one's new replica, in the faults'
  // replace:server) counts as its replica for the cut-off as one connected at the start does.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  const Ending lost = server_after_its_worker_leaves(hosts, 7874, /*says_bye=*/false, /*replica_joins=*/true);
  ASSERT_EQ(lost.failure, "");
  EXPECT_TRUE(lost.finished);
  EXPECT_TRUE(lost.cut_off) << "a server with a joined replica whose every worker vanished took itself for finished";

  const Ending left = server_after_its_worker_leaves(hosts, 7876, /*says_bye=*/true, /*replica_joins=*/true);
  ASSERT_EQ(left.failure, "");
  EXPECT_TRUE(left.finished);
  EXPECT_FALSE(left.cut_off);
}

}  // namespace
}  // namespace gradlane::testing
