// Two sidecars on two emulated hosts and three applications, over real rxe
// (`ci/softroce.sh --hosts 3`): host A runs gradlaned with the server's NIC (endpoint 0, rxe0)
// and a worker NIC (endpoint 2, rxe2); host B runs gradlaned with endpoint 1 (rxe1). Workers
// W1 and W2 (jobs 1 and 2) on host B and W3 (job 3) on host A push updates to the server; the
// receiver's sidecar (A) owns its ingress and grants the slots — to W3 locally, to W1/W2 over
// the RDMA slot-agreement protocol through B.
//
// Checked from both sides: the server saw every sequence number exactly once, in order, each
// payload intact and arriving no earlier than its slot; the receiver's schedule log has
// non-overlapping slots in sequence order; every worker started no earlier than the slot the
// receiver's sidecar logged for it.
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../common/external_process.hpp"
#include "../common/hosts.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

void expect_clean_exit(ExternalProcess& p, const char* what, std::chrono::milliseconds timeout) {
  const auto status = p.wait_exit(timeout);
  ASSERT_TRUE(status.has_value()) << what << " did not finish";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << what << " status " << *status;
}

TEST(TwoSidecars, TransfersFollowTheReceiversGrantedOrderAndSlots) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  const std::string out = std::getenv("GRADLANE_OUT_DIR");
  const std::string push = GRADLANE_EXAMPLE_SIDECAR_PUSH;
  constexpr std::size_t kSlot = 64 * 1024, kPerWorker = 8, kWorkers = 3, kTotal = kPerWorker * kWorkers;
  const std::string shm_a = "/gradlane-test-a", shm_b = "/gradlane-test-b";
  const std::string log_a = out + "/sidecar-a.jsonl", log_b = out + "/sidecar-b.jsonl";
  // rxe under qemu moves ~0.1-0.4 Gb/s; declaring 0.1 Gb/s makes slots long enough to hold a
  // 64 KiB write, so the granted order is also the order of arrival.
  const std::string rate = "0.1";
  // The two sidecars link with the cluster's key, as deployed.
  const std::string key = out + "/cluster.key";
  {
    std::ofstream(key) << "two-sidecars-key\n";
    ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  }

  ExternalProcess sidecar_a({GRADLANE_TEST_GRADLANED,
                             "--key-file",
                             key,
                             "--foreground",
                             "--shm-name",
                             shm_a,
                             "--device",
                             hosts[0].device,
                             "--endpoint",
                             "0",
                             "--endpoint",
                             "2",
                             "--listen-port",
                             "7600",
                             "--expect-peers",
                             "1",
                             "--link-rate-gbps",
                             rate,
                             "--schedule-log",
                             log_a});
  ExternalProcess sidecar_b({GRADLANE_TEST_GRADLANED, "--key-file", key, "--foreground", "--shm-name", shm_b,
                             "--device", hosts[1].device, "--endpoint", "1", "--listen-port", "7601", "--peer",
                             hosts[0].address + ":7600", "--link-rate-gbps", rate, "--schedule-log", log_b});
  ExternalProcess server({push, "server", hosts[0].device, "7700", std::to_string(kSlot), std::to_string(kTotal),
                          std::to_string(kWorkers)});
  auto worker = [&](const std::string& name, const std::string& shm, int job, int endpoint, const Host& host) {
    return std::make_unique<ExternalProcess>(
        std::vector<std::string>{push, "worker", name, shm, std::to_string(job), std::to_string(endpoint), host.device,
                                 hosts[0].address, "7700", "0", std::to_string(kSlot), std::to_string(kPerWorker)});
  };
  auto w1 = worker("w1", shm_b, 1, 1, hosts[1]);
  auto w2 = worker("w2", shm_b, 2, 1, hosts[1]);
  auto w3 = worker("w3", shm_a, 3, 2, hosts[2]);
  expect_clean_exit(*w1, "worker w1", 240s);
  expect_clean_exit(*w2, "worker w2", 60s);
  expect_clean_exit(*w3, "worker w3", 60s);
  expect_clean_exit(server, "server", 60s);
  ::kill(sidecar_a.pid(), SIGTERM);
  ::kill(sidecar_b.pid(), SIGTERM);
  expect_clean_exit(sidecar_a, "gradlaned A", 10s);
  expect_clean_exit(sidecar_b, "gradlaned B", 10s);

  // Receiver side 1: the server application got every sequence number once, intact, and
  // applied them in the granted order.
  std::vector<json> arrivals, applied;
  for (auto& e : read_lines(out + "/server.jsonl")) (e["event"] == "arrived" ? arrivals : applied).push_back(e);
  ASSERT_EQ(arrivals.size(), kTotal);
  ASSERT_EQ(applied.size(), kTotal);
  std::size_t in_order = 0;
  for (std::size_t i = 0; i < kTotal; ++i) {
    EXPECT_TRUE(arrivals[i]["payload_ok"].get<bool>()) << "payload of seq " << arrivals[i]["seq"];
    EXPECT_EQ(applied[i]["seq"], i + 1);
    in_order += arrivals[i]["seq"] == i + 1;
  }
  // Slots are times: a sender starved of CPU (six processes on two emulated vCPUs) can still
  // be writing when the next slot opens, so arrival order is measured, not promised.
  RecordProperty("arrivals_in_granted_order", std::to_string(in_order) + "/" + std::to_string(kTotal));
  std::printf("arrivals in granted order: %zu of %zu\n", in_order, kTotal);
  // Receiver side 2: the receiver's sidecar decided every slot at endpoint 0, in order.
  std::map<std::uint64_t, json> granted;  // seq -> decision
  for (const auto& d : read_lines(log_a)) {
    if (d["kind"] == "go" && d["origin"] == "here" && d["receiver"] == 0) granted[d["seq"].get<std::uint64_t>()] = d;
  }
  ASSERT_EQ(granted.size(), kTotal) << "receiver sidecar's schedule log";
  std::map<int, int> by_sender;
  for (const auto& [seq, d] : granted) ++by_sender[d["sender"].get<int>()];
  EXPECT_EQ(by_sender[1], 2 * static_cast<int>(kPerWorker)) << "W1+W2 through the peer protocol";
  EXPECT_EQ(by_sender[2], static_cast<int>(kPerWorker)) << "W3 locally";
  // Sender side: every worker saw the sequence numbers the receiver assigned, and began no
  // earlier than the slot the *receiver's* sidecar logged for it (the protocol's promise). A
  // worker only spins until the slot its own grant names, so comparing with its own
  // slot_start could not fail; the receiver's log is the independent record — a slot
  // translated wrongly between the sidecars, or a worker that ignored it, shows here.
  std::map<std::uint64_t, json> started;
  for (const char* name : {"w1", "w2", "w3"}) {
    const auto sends = read_lines(out + "/" + name + ".jsonl");
    ASSERT_EQ(sends.size(), kPerWorker) << name;
    for (const auto& s : sends) {
      const auto seq = s["seq"].get<std::uint64_t>();
      ASSERT_TRUE(granted.contains(seq)) << name << " pushed seq " << seq << ", which the receiver never granted";
      EXPECT_GE(s["started"].get<std::int64_t>(), granted[seq]["slot_start"].get<std::int64_t>())
          << name << " started seq " << seq << " before the receiver's slot for it opened";
      started[seq] = s;
    }
  }
  ASSERT_EQ(started.size(), kTotal) << "a sequence number was granted twice";
  // The senders' own view of the same timeline. Slots are times: a sender the CPU starves starts
  // late, finishes late, and may still be on the wire when the next slot opens (the receiver
  // cuts a slot at slot_start + the reported wire time). That is measured, not asserted — a CI
  // run under load saw seq 18 end 1.0 ms into seq 19's slot; the protocol's promise, asserted
  // below on the receiver's log, is that the slots it hands out never overlap.
  std::size_t overruns = 0;
  std::int64_t worst_ns = 0;
  for (std::uint64_t seq = 2; seq <= kTotal; ++seq) {
    const auto previous_close =
        std::min(granted[seq - 1]["slot_end"].get<std::int64_t>(), started[seq - 1]["done"].get<std::int64_t>());
    const auto late = previous_close - granted[seq]["slot_start"].get<std::int64_t>();
    if (late > 0) {
      ++overruns;
      worst_ns = std::max(worst_ns, late);
    }
  }
  std::printf("sender-side overruns into the next slot: %zu of %zu (worst %.2f ms)\n", overruns,
              static_cast<std::size_t>(kTotal - 1), static_cast<double>(worst_ns) / 1e6);
  // The same timeline as the receiver's sidecar logged it: each planned slot cut at the used_end
  // of its completion line. Every transfer it granted was completed, and none overlaps.
  std::map<std::uint64_t, std::pair<std::int64_t, std::int64_t>> used;  // transfer -> [start, end)
  for (const auto& [seq, d] : granted) used[d["transfer"].get<std::uint64_t>()] = {d["slot_start"], d["slot_end"]};
  std::size_t completions = 0;
  for (const auto& c : read_lines(log_a)) {
    if (c["kind"] != "completion" || c["receiver"] != 0 || !used.contains(c["transfer"].get<std::uint64_t>())) continue;
    ++completions;
    auto& slot = used[c["transfer"].get<std::uint64_t>()];
    slot.second = std::min(slot.second, c["used_end"].get<std::int64_t>());
  }
  EXPECT_EQ(completions, kTotal) << "a completion line per granted transfer in the receiver's log";
  std::vector<std::pair<std::int64_t, std::int64_t>> timeline;
  for (const auto& [transfer, slot] : used) timeline.push_back(slot);
  std::sort(timeline.begin(), timeline.end());
  for (std::size_t i = 1; i < timeline.size(); ++i) {
    EXPECT_LE(timeline[i - 1].second, timeline[i].first) << "logged slots overlap at " << timeline[i].first;
  }
  // All processes share the VM's CLOCK_MONOTONIC, so the receiver's slots can be compared with
  // the arrivals directly (the protocol itself never assumes a shared clock): nothing arrived
  // before the receiver's slot for it began.
  for (const auto& a : arrivals) {
    const auto seq = a["seq"].get<std::uint64_t>();
    if (granted.contains(seq)) {
      EXPECT_GE(a["at"].get<std::int64_t>(), granted[seq]["slot_start"].get<std::int64_t>()) << "seq " << seq;
    }
  }
  // Sender's sidecar saw the peer's answers (origin "peer") for W1 and W2.
  std::size_t from_peer = 0;
  for (const auto& d : read_lines(log_b)) from_peer += d["origin"] == "peer" && d["kind"] == "go";
  EXPECT_EQ(from_peer, 2 * kPerWorker);
}

}  // namespace
}  // namespace gradlane::testing
