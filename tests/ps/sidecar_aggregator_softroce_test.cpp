// The aggregator in sidecar mode over rxe: workers that come back again and again, connections
// dropped before their hello, and with grant windows each worker writing only its own partition.
#include <sys/wait.h>

#include <atomic>
#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradlane/gradlane.hpp"

#include "../common/external_process.hpp"
#include "../common/hosts.hpp"
#include "tests/ps/ps_synthetic.hpp"
#include "ps_run.hpp"
#include "ps/receiving/kernels.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// A sidecar-mode aggregator for one worker has 1 + 4 spare partitions of its member ring. One
// worker connects, says hello and goes, 9 times (as after restarts): each connection must be
// given a partition of its own, which needs the partitions of the connections gone to come back
// (otherwise the sixth connection is refused: "more than 5 connections to accept").
// A sidecar-mode aggregator (host 2, ps::Aggregator) forwarding to a server (host 0,
// ps::ShardServer), each on a thread of the test, attached to the test's gradlaned. `joined` and
// `gone` follow the aggregator's workers; a failure of either thread is kept, and ends the rig.
class SidecarAggregatorRig {
 public:
  static constexpr std::size_t kFloats = 1024, kBytes = kFloats * sizeof(float);

  SidecarAggregatorRig(const std::vector<Host>& hosts, const std::string& shm, std::uint16_t server_port,
                       std::uint16_t aggregator_port, std::uint32_t workers, bool grant_windows)
      : server_thread_([=, this] {
          try {
            Device device = Device::open({.name = hosts[0].device});
            ps::ShardOptions shard;
            shard.floats = kFloats;
            shard.slots = 8;
            ps::ShardServer server(device, ps::Role::server, server_port, shard, std::vector<float>(kFloats, 0.0F));
            server.accept_peers(1, 60s);  // the aggregator's forward
            while (!stop.load()) {
              if (server.progress() == 0) server.wait_for_input(5ms);
            }
          } catch (const std::exception& e) {
            server_failure = e.what();
          }
        }),
        aggregator_thread_([=, this] {
          try {
            Device device = Device::open({.name = hosts[2].device});
            ps::AggregatorOptions o;
            o.id = 100;
            o.server = {hosts[0].address, server_port};
            o.floats = kFloats;
            o.workers = workers;
            o.grant_windows = grant_windows;
            sidecar::AttachOptions attach;
            attach.shm_name = shm;
            attach.job = 1;
            attach.endpoint = 2;
            o.sidecar = attach;
            ps::Aggregator aggregator(device, aggregator_port, o);
            aggregator.accept_workers(workers, 60s);
            joined = workers;
            while (!stop.load()) {
              if (aggregator.progress() == 0) std::this_thread::sleep_for(100us);
              joined = workers + aggregator.stats().peers_joined;
              gone = aggregator.stats().peers_lost + aggregator.stats().peers_left;
            }
          } catch (const std::exception& e) {
            aggregator_failure = e.what();
            stop = true;
          }
        }) {}
  ~SidecarAggregatorRig() { finish(); }
  SidecarAggregatorRig(const SidecarAggregatorRig&) = delete;
  SidecarAggregatorRig& operator=(const SidecarAggregatorRig&) = delete;

  // Waits (30 s at most) until `counter` reaches `value`; false if it did not, or the rig failed.
  bool wait_until(const std::atomic<std::uint64_t>& counter, std::uint64_t value) const {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (counter.load() < value && !stop.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    return counter.load() >= value;
  }
  // Stops both threads and joins them: the failures are final after it.
  void finish() {
    stop = true;
    if (aggregator_thread_.joinable()) aggregator_thread_.join();
    if (server_thread_.joinable()) server_thread_.join();
  }

  // Declared before the threads, which use them from their first instruction.
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> joined{0}, gone{0};
  std::string server_failure, aggregator_failure;

 private:
  std::jthread server_thread_, aggregator_thread_;
};

TEST(SidecarAggregator, AWorkerThatComesBackAgainAndAgainGetsAPartitionEachTime) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr int kComebacks = 9;
  const std::string out = fresh_test_dir(), shm = "/gradlane-test-partitions";
  ExternalProcess daemon({GRADLANE_GRADLANED, "--foreground", "--shm-name", shm}, out + "/gradlaned");
  ASSERT_TRUE(wait_for_text(out + "/gradlaned.err", "gradlaned: serving", 120s));
  SidecarAggregatorRig rig(hosts, shm, 7860, 7861, 1, /*grant_windows=*/false);

  Device device = Device::open({.name = hosts[1].device});
  std::set<std::uint64_t> partitions;
  for (int i = 0; i < kComebacks; ++i) {
    SCOPED_TRACE("connection " + std::to_string(i + 1));
    Connection c = ps::connect_with_retry(device, hosts[2].address, 7861, TransportOptions{}, 30s);
    const RegionDescriptor mine = c.wait_region(ps::kSlotRegionId, 30s);
    partitions.insert(mine.addr);
    c.send(ps::encode(ps::Hello{ps::PeerKind::worker, 1}));
    ASSERT_TRUE(rig.wait_until(rig.joined, static_cast<std::uint64_t>(i + 1)))
        << "not admitted; " << rig.aggregator_failure;
    c.close();
    ASSERT_TRUE(rig.wait_until(rig.gone, static_cast<std::uint64_t>(i + 1)))
        << "its leaving not seen; " << rig.aggregator_failure;
  }
  rig.finish();
  EXPECT_EQ(rig.aggregator_failure, "");
  EXPECT_EQ(rig.server_failure, "");
  EXPECT_LE(partitions.size(), 5u) << "more partitions than the ring has";
}

TEST(SidecarAggregator, AConnectionDroppedBeforeItsHelloGivesItsPartitionBack) {
  // One worker, so 1 + 4 spare partitions. Four connections that never say hello take the four
  // spares; once the aggregator has dropped them (no hello within its patience), a new worker
  // still gets a partition: one advertised to a connection that never says hello is not held
  // for good.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  const std::string out = fresh_test_dir(), shm = "/gradlane-test-silent-partitions";
  ExternalProcess daemon({GRADLANE_GRADLANED, "--foreground", "--shm-name", shm}, out + "/gradlaned");
  ASSERT_TRUE(wait_for_text(out + "/gradlaned.err", "gradlaned: serving", 120s));
  SidecarAggregatorRig rig(hosts, shm, 7864, 7865, 1, /*grant_windows=*/true);

  Device device = Device::open({.name = hosts[1].device});
  const auto connect = [&] { return ps::connect_with_retry(device, hosts[2].address, 7865, TransportOptions{}, 30s); };
  Connection worker = connect();
  (void)worker.wait_region(ps::kSlotRegionId, 30s);
  worker.send(ps::encode(ps::Hello{ps::PeerKind::worker, 1}));
  ASSERT_TRUE(rig.wait_until(rig.joined, 1)) << rig.aggregator_failure;
  std::vector<Connection> silent;
  for (int i = 0; i < 4; ++i) {
    silent.push_back(connect());
    (void)silent.back().wait_region(ps::kSlotRegionId, 30s);  // a partition each, and no hello
  }
  for (Connection& c : silent) {  // the aggregator drops each after its patience (5 s)
    EXPECT_THROW((void)c.receive(30s), Error) << "a silent connection was not dropped";
  }
  Connection back = connect();
  EXPECT_NO_THROW((void)back.wait_region(ps::kSlotRegionId, 30s)) << "no partition for a new worker";
  back.send(ps::encode(ps::Hello{ps::PeerKind::worker, 2}));
  EXPECT_TRUE(rig.wait_until(rig.joined, 2)) << "not admitted; " << rig.aggregator_failure;
  rig.finish();
  EXPECT_EQ(rig.aggregator_failure, "");
  EXPECT_EQ(rig.server_failure, "");
}

TEST(SidecarAggregator, WithGrantWindowsAWorkerWritesOnlyItsOwnPartition) {
  // Each worker's partition of the member ring is a region of its own that no key opens; a
  // worker is handed, with its partition, the key of a window bound on its connection over it
  // alone. Its own members land; a write into the other worker's partition — with its own key,
  // the only one it has — is refused by the NIC.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::size_t kBytes = SidecarAggregatorRig::kBytes;
  const std::string out = fresh_test_dir(), shm = "/gradlane-test-partition-windows";
  ExternalProcess daemon({GRADLANE_GRADLANED, "--foreground", "--shm-name", shm}, out + "/gradlaned");
  ASSERT_TRUE(wait_for_text(out + "/gradlaned.err", "gradlaned: serving", 120s));
  SidecarAggregatorRig rig(hosts, shm, 7862, 7863, 2, /*grant_windows=*/true);

  Device device = Device::open({.name = hosts[1].device});
  auto join = [&](std::uint32_t id) {
    Connection c = ps::connect_with_retry(device, hosts[2].address, 7863, TransportOptions{}, 30s);
    const RegionDescriptor mine = c.wait_region(ps::kSlotRegionId, 30s);
    c.send(ps::encode(ps::Hello{ps::PeerKind::worker, id}));
    return std::pair{std::move(c), mine};
  };
  auto [a, a_partition] = join(1);
  auto [b, b_partition] = join(2);
  ASSERT_TRUE(rig.wait_until(rig.joined, 2)) << rig.aggregator_failure;
  EXPECT_NE(a_partition.addr, b_partition.addr);
  EXPECT_NE(a_partition.rkey, b_partition.rkey) << "each partition comes with its own window's key";

  Buffer payload = Buffer::allocate(kBytes);
  const MemoryRegion payload_mr = MemoryRegion::register_buffer(device, payload, Access::local);
  EXPECT_EQ(refusal_of(a, a.write(payload_mr, 0, a_partition, 0, kBytes, Signal::always)), "landed");
  EXPECT_EQ(
      refusal_of(b, b.write(payload_mr, 0, {a_partition.addr, kBytes, b_partition.rkey}, 0, kBytes, Signal::always)),
      "remote_access")
      << "a worker wrote another's partition";
  EXPECT_EQ(
      refusal_of(a, a.write(payload_mr, 0, {b_partition.addr, kBytes, a_partition.rkey}, 0, kBytes, Signal::always)),
      "remote_access")
      << "a worker wrote another's partition";
  rig.finish();
  EXPECT_EQ(rig.aggregator_failure, "");
  EXPECT_EQ(rig.server_failure, "");
}

}  // namespace
}  // namespace gradlane::testing
