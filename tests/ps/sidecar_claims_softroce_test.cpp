// The sidecar-mode claim without grant windows, driven by the test process over rxe: a claimed
// sequence is held for its claimant — past a hole timeout, and past its sender's gradlaned's
// death — so that its write, however late, is applied and never lands in a slot a later
// sequence reuses; a claimant dropped past ten hole timeouts is dropped at the replica too.
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradlane/gradlane.hpp"

#include "../common/external_process.hpp"
#include "../common/hosts.hpp"
#include "rogue_workers.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

TEST_F(RogueWorkers, WithoutGrantWindowsAClaimedHeadIsHeldUntilItsClaimantWritesOrIsDropped) {
  // Sidecar mode, no windows: a sidecar-mode aggregator's forward claims its sequence (token 0)
  // and may stall before it writes. The server must not skip a head so claimed while the
  // claimant's connection lives — its write would land in a slot a later sequence reuses — and
  // past ten hole timeouts it drops the claimant (nothing of it lands any more) and skips.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-held-claims"), shm = "/gradlane-test-held-claims";
  ExternalProcess daemon({GRADLANE_GRADLANED, "--foreground", "--shm-name", shm}, out + "/gradlaned");
  ASSERT_TRUE(wait_for_text(out + "/gradlaned.err", "gradlaned: serving", 120s));
  // updates=2: more than arrive, so the server runs until every connection is gone.
  ExternalProcess server(
      {GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7818", "floats=" + std::to_string(kFloats),
       "slots=8", "workers=3", "updates=2", "out=" + out, "sidecar=" + shm, "endpoint=0", "hole_timeout_ms=500"},
      out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto join = [&](std::uint32_t id) { return RogueWorkers::join(device, hosts[0].address, 7818, id); };
  auto [forward, slots] = join(9);
  auto [honest, ring1] = join(1);
  auto [stalled, ring2] = join(3);
  (void)ring1, (void)ring2;
  sidecar::Client apps = attach_apps(shm);
  auto grant = [&] { return grant_from(apps, /*windows=*/false); };
  auto claim_key = [](Connection& c, std::uint64_t sequence) { return claim(c, sequence, 0).window_rkey; };
  const Payloads payloads(device);
  const auto push = [&](Connection& c, std::uint64_t sequence) {
    c.wait(c.write_and_ring(payloads.gradient_mr, 0, slots, (sequence % 8) * kBytes, kBytes,
                            static_cast<std::uint32_t>(sequence)),
           30s);
  };

  // 1. Claimed, then written 1.5 s (three hole timeouts) after a later sequence arrived: held.
  const sidecar::Grant first = grant();
  EXPECT_EQ(claim_key(forward, first.sequence), slots.rkey) << "without windows the answer is the ring's own key";
  const sidecar::Grant second = grant();
  push(honest, second.sequence);
  std::this_thread::sleep_for(1500ms);
  push(forward, first.sequence);
  // 2. Claimed and never written: its claimant is dropped past ten hole timeouts, and skipped.
  const sidecar::Grant third = grant();
  EXPECT_NE(claim_key(stalled, third.sequence), 0u);
  const sidecar::Grant fourth = grant();
  push(honest, fourth.sequence);
  const auto claimed_at = std::chrono::steady_clock::now();
  EXPECT_TRUE(dropped_within(stalled, 20s)) << "the stalled claimant was not dropped";
  EXPECT_GE(std::chrono::steady_clock::now() - claimed_at, 4500ms) << "dropped before ten hole timeouts";
  // 3. A claim of a sequence decided already: key 0, nothing to write.
  EXPECT_EQ(claim_key(forward, third.sequence), 0u);
  for (const sidecar::Grant& g : {first, second, fourth}) apps.complete(g.request, g.part_index, 1us);
  apps.complete(third.request, third.part_index, 0us, /*failed=*/true);

  for (Connection* c : {&forward, &honest, &stalled}) {
    Connection leave = std::move(*c);
  }
  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 3u) << "the held head and the two honest updates";
  EXPECT_EQ(stats["skipped"].get<std::uint64_t>(), 1u) << "the never-written claim";
  EXPECT_EQ(stats["claimed"].get<std::uint64_t>(), 2u);
  expect_moved_by_one_update(out, "the held head was not applied, or something else was", 3);
}

TEST_F(RogueWorkers, WithoutGrantWindowsAClaimantTheServerDropsIsDroppedByTheReplicaToo) {
  // Sidecar mode, no windows, with a replica: a worker claims its sequence and stalls past ten
  // hole timeouts, so the server drops it and skips the sequence. Its mirror, written after
  // that, must not land at the replica either: there the slot is reused once the skip is
  // followed, and a late mirror would overwrite a later update's (and its worker, its server
  // write failing, would fail over to the replica and make the live server step down).
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-dropped-at-replica"), shm = "/gradlane-test-dropped";
  ExternalProcess daemon({GRADLANE_GRADLANED, "--foreground", "--shm-name", shm}, out + "/gradlaned");
  ASSERT_TRUE(wait_for_text(out + "/gradlaned.err", "gradlaned: serving", 120s));
  const std::vector<std::string> shard = {"floats=" + std::to_string(kFloats),
                                          "slots=8",
                                          "workers=2",
                                          "updates=2",
                                          "out=" + out,
                                          "endpoint=0",
                                          "hole_timeout_ms=500"};
  const auto node = [&](std::vector<std::string> args) {
    args.insert(args.begin(), GRADLANE_PS_NODE);
    args.insert(args.end(), shard.begin(), shard.end());
    return args;
  };
  // Its sidecar, only ever attached at a promotion, is never started.
  ExternalProcess replica(
      node({"role=replica", "device=" + hosts[1].device, "port=7827", "sidecar=/gradlane-test-dropped-standby"}),
      out + "/replica");
  ExternalProcess server(node({"role=server", "device=" + hosts[0].device, "port=7826", "sidecar=" + shm,
                               "replica=" + hosts[1].address + ":7827"}),
                         out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto [honest, ring] = join(device, hosts[0].address, 7826, 1);
  auto [stalled, ring3] = join(device, hosts[0].address, 7826, 3);
  auto [honest_mirror, mirror_ring] = join(device, hosts[1].address, 7827, 1, ps::Addressed::replica);
  auto [stalled_mirror, mirror_ring3] = join(device, hosts[1].address, 7827, 3, ps::Addressed::replica);
  (void)ring3, (void)mirror_ring3;
  sidecar::Client apps = attach_apps(shm);
  const Payloads payloads(device);
  const auto write = [&](Connection& c, const RegionDescriptor& slots, std::uint64_t sequence) {
    c.wait(c.write_and_ring(payloads.gradient_mr, 0, slots, (sequence % 8) * kBytes, kBytes,
                            static_cast<std::uint32_t>(sequence)),
           30s);
  };

  const sidecar::Grant claimed = grant_from(apps, /*windows=*/false);
  EXPECT_NE(claim(stalled, claimed.sequence, 0).window_rkey, 0u);
  const sidecar::Grant later = grant_from(apps, /*windows=*/false);
  write(honest_mirror, mirror_ring, later.sequence);
  write(honest, ring, later.sequence);
  ASSERT_TRUE(dropped_within(stalled, 20s)) << "the server did not drop the stalled claimant";
  std::this_thread::sleep_for(1s);  // the replica hears it on the server's connection meanwhile
  bool mirror_landed = true;
  try {
    write(stalled_mirror, mirror_ring, claimed.sequence);
  } catch (const Error&) {
    mirror_landed = false;
  }
  EXPECT_FALSE(mirror_landed) << "the dropped worker's late mirror landed at the replica";
  apps.complete(later.request, later.part_index, 1us);
  apps.complete(claimed.request, claimed.part_index, 0us, /*failed=*/true);

  for (Connection* c : {&honest, &stalled, &honest_mirror, &stalled_mirror}) {
    Connection leave = std::move(*c);
  }
  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(stats["skipped"].get<std::uint64_t>(), 1u) << "the claim never written";
  EXPECT_FALSE(stats["stepped_down"].get<bool>());
  const auto replica_exit = replica.wait_exit(60s);
  ASSERT_TRUE(replica_exit.has_value()) << "the replica did not finish";
  std::ifstream replica_file(out + "/replica.stats.json");
  const json at_replica = json::parse(replica_file);
  EXPECT_EQ(at_replica["applied"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(at_replica["skipped"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(at_replica["refused_doorbells"].get<std::uint64_t>(), 0u) << "a late doorbell rang at the replica";
}

TEST_F(RogueWorkers, WithoutGrantWindowsASequenceClaimedBeforeItsSendersGradlanedDiedIsHeldForItsWrite) {
  // The worker's gradlaned (B, host 2) is not the server's (A, host 0): its grant comes from A
  // through B. The worker claims it, then B is SIGKILLed. A fails every transfer it granted
  // through B — their senders may be dead, and nobody will report them — and cancels their
  // sequences; but this worker lives and writes. Skipped, its write would land anyway, in a
  // slot a later sequence reuses, and be acknowledged to the worker: an acknowledged push lost
  // (the kill:gradlaned-b fault). Held for its claimant, it is applied.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-sender-sidecar-lost");
  const std::string shm_a = "/gradlane-test-lost-a", shm_b = "/gradlane-test-lost-b";
  ExternalProcess daemon_a({GRADLANE_GRADLANED, "--foreground", "--shm-name", shm_a, "--device", hosts[0].device,
                            "--endpoint", "0", "--listen-port", "7660", "--expect-peers", "1"},
                           out + "/gradlaned-a");
  ExternalProcess daemon_b({GRADLANE_GRADLANED, "--foreground", "--shm-name", shm_b, "--device", hosts[2].device,
                            "--endpoint", "2", "--listen-port", "7661", "--peer", hosts[0].address + ":7660"},
                           out + "/gradlaned-b");
  for (const char* name : {"/gradlaned-a.err", "/gradlaned-b.err"}) {
    ASSERT_TRUE(wait_for_text(out + name, "gradlaned: serving", 120s)) << name;
  }
  ExternalProcess server(
      {GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7819", "floats=" + std::to_string(kFloats),
       "slots=8", "workers=1", "updates=2", "out=" + out, "sidecar=" + shm_a, "endpoint=0", "hole_timeout_ms=500"},
      out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto [worker, slots] = join(device, hosts[0].address, 7819, 1);
  const Payloads payloads(device);
  std::uint64_t sequence = 0;
  {
    sidecar::Client apps = attach_apps(shm_b);
    sequence = grant_from(apps, /*windows=*/false).sequence;
    EXPECT_EQ(claim(worker, sequence, 0).window_rkey, slots.rkey) << "claimed without windows: the ring's own key";
    daemon_b.kill_hard();
    ASSERT_TRUE(wait_for_text(out + "/gradlaned-a.err", "lost: its pending requests are dropped", 30s))
        << "gradlaned A did not notice B's death";
    std::this_thread::sleep_for(1s);  // the server takes A's cancel meanwhile
  }
  worker.wait(worker.write_and_ring(payloads.gradient_mr, 0, slots, (sequence % 8) * kBytes, kBytes,
                                    static_cast<std::uint32_t>(sequence)),
              30s);
  { Connection leave = std::move(worker); }

  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["held_cancels"].get<std::uint64_t>(), 1u) << "A's cancel of the claimed sequence";
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u) << "the claimed sequence, written after its cancel";
  EXPECT_EQ(stats["skipped"].get<std::uint64_t>(), 0u);
  expect_moved_by_one_update(out, "the write acknowledged to the worker was not applied");
}

}  // namespace
}  // namespace gradlane::testing
