// Workers that misbehave on purpose, driven by the test process itself over rxe: bad doorbells,
// malformed messages, writes outside their grant, claims of slots that are not theirs.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradlane/gradlane.hpp"

#include "../common/external_process.hpp"
#include "../common/hosts.hpp"
#include "tests/ps/ps_synthetic.hpp"
#include "link_faults.hpp"
#include "ps_run.hpp"
#include "ps/receiving/kernels.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"

#include "rogue_workers.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

TEST_F(RogueWorkers, BadDoorbellsAndMalformedMessagesAreRefusedAndTheModelIsUntouched) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue");
  ExternalProcess server({GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7810",
                          "floats=" + std::to_string(kFloats), "slots=8", "workers=2", "updates=1", "out=" + out},
                         out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto [good, slots] = join(device, hosts[0].address, 7810, 1);
  auto [bad, bad_slots] = join(device, hosts[0].address, 7810, 2);
  (void)bad_slots;

  const Payloads payloads(device);
  const MemoryRegion &junk_mr = payloads.junk_mr, &gradient_mr = payloads.gradient_mr;

  // 1. A doorbell for a sequence never granted (5): refused, its slot never applied.
  good.wait(good.write_and_ring(junk_mr, 0, slots, 5 * kBytes, kBytes, 5), 30s);
  // 2. The one legitimate push: request, grant, write, doorbell.
  good.send(ps::encode(ps::Request{1, 0, 0}));
  const ps::Message answer = ps::decode(good.receive(30s));
  ASSERT_TRUE(std::holds_alternative<ps::Grant>(answer));
  const std::uint64_t seq = std::get<ps::Grant>(answer).sequence;
  EXPECT_EQ(seq, 1u);
  good.wait(good.write_and_ring(gradient_mr, 0, slots, (seq % 8) * kBytes, kBytes, static_cast<std::uint32_t>(seq)),
            30s);
  // 3. The same doorbell again (a replay of an applied or arrived sequence): refused.
  good.wait(good.write_with_imm(gradient_mr, 0, slots, 0, 0, static_cast<std::uint32_t>(seq)), 30s);
  // 4. A malformed message on the other connection: that peer is dropped, nobody else is.
  const std::vector<std::byte> garbage(7, std::byte{0xee});
  bad.send(garbage);
  bad.flush(30s);
  good.send(ps::encode(ps::Bye{1}));  // the good one says it finished: it leaves, not lost
  good.flush(30s);
  std::this_thread::sleep_for(500ms);  // let the server take all of it before we leave
  { Connection leave_good = std::move(good); }
  { Connection leave_bad = std::move(bad); }

  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(stats["refused_doorbells"].get<std::uint64_t>(), 2u);
  EXPECT_EQ(stats["peers_lost"].get<std::uint64_t>(), 1u) << "the sender of the malformed message";
  expect_moved_by_one_update(out, "a refused doorbell changed the model");  // the one legitimate update
}

TEST_F(RogueWorkers, WithGrantWindowsAWorkerWritesOnlyItsGrantedSlotWhileItsGrantLasts) {
  // The victim (worker 1) writes its update into its granted slot and, before it rings, two
  // rogues try to overwrite that slot: worker 2 with the ring's own key, worker 3 with the key
  // of its own grant. Then the victim rings; afterwards it tries its key again (too late: the
  // update is in), and worker 4 writes a grant it let expire. Every rogue write is refused by
  // the NIC, and the model moves by exactly the victim's update.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-windows");
  ExternalProcess server(
      {GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7811", "floats=" + std::to_string(kFloats),
       "slots=8", "workers=4", "updates=1", "out=" + out, "grant_windows=1", "hole_timeout_ms=500"},
      out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto join = [&](std::uint32_t id) { return RogueWorkers::join(device, hosts[0].address, 7811, id); };
  auto grant_for = [](Connection& c, std::uint32_t id) {
    c.send(ps::encode(ps::Request{id, 0, 0}));
    const ps::Message answer = ps::decode(c.receive(30s));
    EXPECT_TRUE(std::holds_alternative<ps::Grant>(answer));
    return std::get<ps::Grant>(answer);
  };
  auto [victim, slots] = join(1);
  auto [ring_key_rogue, ring1] = join(2);
  auto [other_grant_rogue, ring2] = join(3);
  auto [late, ring3] = join(4);
  (void)ring1, (void)ring2, (void)ring3;

  const Payloads payloads(device);
  const MemoryRegion &junk_mr = payloads.junk_mr, &gradient_mr = payloads.gradient_mr;

  const ps::Grant mine = grant_for(victim, 1);
  ASSERT_EQ(mine.sequence, 1u);
  ASSERT_NE(mine.window_rkey, 0u) << "a windowed server's grant carries a window key";
  EXPECT_NE(mine.window_rkey, slots.rkey);
  const RegionDescriptor my_slot{slots.addr + (mine.sequence % 8) * kBytes, kBytes, mine.window_rkey};
  EXPECT_EQ(refusal_of(victim, victim.write(gradient_mr, 0, my_slot, 0, kBytes, Signal::always)), "landed");

  // The ring's own key opens the ring for reading only.
  EXPECT_EQ(refusal_of(ring_key_rogue,
                       ring_key_rogue.write(junk_mr, 0, slots, (mine.sequence % 8) * kBytes, kBytes, Signal::always)),
            "remote_access");
  // A key of another grant opens that grant's slot only.
  const ps::Grant theirs = grant_for(other_grant_rogue, 3);
  ASSERT_NE(theirs.window_rkey, 0u);
  EXPECT_NE(theirs.sequence % 8, mine.sequence % 8);
  EXPECT_EQ(
      refusal_of(other_grant_rogue, other_grant_rogue.write(junk_mr, 0, {my_slot.addr, kBytes, theirs.window_rkey}, 0,
                                                            kBytes, Signal::always)),
      "remote_access");

  // The victim rings (a doorbell alone): the server applies what is in the slot.
  victim.wait(victim.write_with_imm(gradient_mr, 0, my_slot, 0, 0, static_cast<std::uint32_t>(mine.sequence)), 30s);
  std::this_thread::sleep_for(300ms);  // the server takes the doorbell and closes the window
  EXPECT_EQ(refusal_of(victim, victim.write(junk_mr, 0, my_slot, 0, kBytes, Signal::always)), "remote_access")
      << "the key of a grant whose update arrived must be dead";

  // A grant held past the hole timeout (500 ms) is skipped, and its key dies with it.
  const ps::Grant stale = grant_for(late, 4);
  ASSERT_NE(stale.window_rkey, 0u);
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(
      refusal_of(late, late.write(junk_mr, 0, {slots.addr + (stale.sequence % 8) * kBytes, kBytes, stale.window_rkey},
                                  0, kBytes, Signal::always)),
      "remote_access")
      << "the key of a skipped grant must be dead";

  { Connection leave = std::move(victim); }
  { Connection leave = std::move(ring_key_rogue); }
  { Connection leave = std::move(other_grant_rogue); }
  { Connection leave = std::move(late); }
  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u);
  EXPECT_GE(stats["skipped"].get<std::uint64_t>(), 1u) << "the late worker's grant";
  expect_moved_by_one_update(out, "a refused write changed the model");
}

TEST_F(RogueWorkers, WithoutGrantWindowsASkippedGrantsSlotRestsUntilItsWorkerAsksAgain) {
  // No windows to close: a worker's write that comes after its grant was skipped (it stalled
  // past hole_timeout) lands in the slot whenever it comes.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-late-write");
  // updates=8: more than arrive, so the server runs until both workers leave.
  ExternalProcess server(
      {GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7813", "floats=" + std::to_string(kFloats),
       "slots=" + std::to_string(kLateSlots), "workers=2", "updates=8", "out=" + out, "hole_timeout_ms=500"},
      out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  LateWriter run(device, hosts[0].address, 7813);
  const std::uint64_t updates = run.push_around_it();
  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), updates);
  EXPECT_GE(stats["skipped"].get<std::uint64_t>(), 3u) << "the late grant and the sequences that would reuse its slot";
  expect_moved_by_one_update(out, "a late write landed in an update that was then applied", static_cast<int>(updates));
}

TEST_F(RogueWorkers, AnAggregatorRestsASkippedMembersSlotUntilItsWorkerAsksAgain) {
  // The same at a direct-mode aggregator, whose member ring has no windows at all. Groups of
  // one, so the server's model moves by exactly the members' updates.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-late-member");
  const std::string floats = "floats=" + std::to_string(kFloats);
  // updates=100: more than arrive, so the server runs until the aggregator leaves.
  ExternalProcess server({GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7816", floats, "slots=8",
                          "workers=1", "updates=100", "out=" + out},
                         out + "/server");
  ExternalProcess aggregator({GRADLANE_PS_NODE, "role=aggregator", "device=" + hosts[1].device, "port=7817", "id=9",
                              "server=" + hosts[0].address + ":7816", floats, "group=1", "workers=2",
                              "slots=" + std::to_string(kLateSlots), "hole_timeout_ms=500", "out=" + out},
                             out + "/aggregator");
  Device device = Device::open({.name = hosts[2].device});
  LateWriter run(device, hosts[1].address, 7817);
  const std::uint64_t updates = run.push_around_it();
  const auto status = aggregator.wait_exit(60s);
  EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "the aggregator did not finish";
  std::ifstream aggregator_stats(out + "/aggregator.stats.json");
  const json stats = json::parse(aggregator_stats);
  EXPECT_EQ(stats["summed"].get<std::uint64_t>(), updates);
  EXPECT_GE(stats["skipped"].get<std::uint64_t>(), 3u) << "the late member and the members that would reuse its slot";
  EXPECT_EQ(finished_stats(server, out)["applied"].get<std::uint64_t>(), updates);
  expect_moved_by_one_update(out, "a late write landed in a member that was then summed", static_cast<int>(updates));
}

TEST_F(RogueWorkers, WithSidecarGrantWindowsOnlyTheGranteeOpensItsSlotAndOnlyOnce) {
  // Sidecar mode: the server does not grant, gradlaned does, so the server cannot know whom a
  // sequence went to — only that the one who shows the grant's token is its grantee. The
  // victim (worker 1) is granted sequence 1 and writes it. Rogues of the same job (they hold
  // the job key, so they have connections): one claims it with a forged token, one with the
  // victim's own token replayed after the victim claimed it, one writes with the ring's key,
  // one with the key of its own claimed grant (sequence 2), one rings the victim's doorbell.
  // Each is refused — the claims by the server, the writes by the NIC — and the model moves
  // by exactly the victim's update.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-sidecar-windows"), shm = "/gradlane-test-rogue-windows";
  ExternalProcess daemon({GRADLANE_GRADLANED, "--foreground", "--shm-name", shm}, out + "/gradlaned");
  ASSERT_TRUE(wait_for_text(out + "/gradlaned.err", "gradlaned: serving", 120s));
  ExternalProcess server({GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7812",
                          "floats=" + std::to_string(kFloats), "slots=8", "workers=6", "updates=1", "out=" + out,
                          "sidecar=" + shm, "endpoint=0", "grant_windows=1", "hole_timeout_ms=60000"},
                         out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto join = [&](std::uint32_t id) { return RogueWorkers::join(device, hosts[0].address, 7812, id); };
  auto [victim, slots] = join(1);
  auto [forger, ring1] = join(2);
  auto [replayer, ring2] = join(3);
  auto [ring_key_rogue, ring3] = join(4);
  auto [other_grant_rogue, ring4] = join(5);
  auto [bell_rogue, ring5] = join(6);
  (void)ring1, (void)ring2, (void)ring3, (void)ring4, (void)ring5;

  sidecar::Client apps = attach_apps(shm);
  auto grant = [&] { return grant_from(apps, /*windows=*/true); };
  // Whether the server dropped `c` (its answer to a refused claim).
  auto dropped = [](Connection& c) { return dropped_within(c, 10s); };

  const Payloads payloads(device);
  const MemoryRegion &junk_mr = payloads.junk_mr, &gradient_mr = payloads.gradient_mr;

  const sidecar::Grant mine = grant();
  ASSERT_EQ(mine.sequence, 1u);
  forger.send(ps::encode(ps::Claim{mine.sequence, mine.token ^ 1}));
  EXPECT_TRUE(dropped(forger)) << "a claim with a forged token";
  const ps::Opened window = claim(victim, mine.sequence, mine.token);
  ASSERT_EQ(window.sequence, mine.sequence);
  ASSERT_NE(window.window_rkey, 0u);
  EXPECT_NE(window.window_rkey, slots.rkey);
  replayer.send(ps::encode(ps::Claim{mine.sequence, mine.token}));
  EXPECT_TRUE(dropped(replayer)) << "a second claim of a claimed sequence, with its right token";
  // A doorbell alone needs no key (a zero-length write): before the victim wrote, it would have
  // the server apply an empty slot. Refused from anyone but the claimant.
  bell_rogue.wait(bell_rogue.write_with_imm(junk_mr, 0, slots, 0, 0, static_cast<std::uint32_t>(mine.sequence)), 30s);
  std::this_thread::sleep_for(300ms);
  const RegionDescriptor my_slot{slots.addr + (mine.sequence % 8) * kBytes, kBytes, window.window_rkey};
  EXPECT_EQ(refusal_of(victim, victim.write(gradient_mr, 0, my_slot, 0, kBytes, Signal::always)), "landed")
      << "the rogue's doorbell closed the victim's slot";

  EXPECT_EQ(refusal_of(ring_key_rogue,
                       ring_key_rogue.write(junk_mr, 0, slots, (mine.sequence % 8) * kBytes, kBytes, Signal::always)),
            "remote_access");
  const sidecar::Grant theirs = grant();
  ASSERT_EQ(theirs.sequence, 2u);
  EXPECT_NE(theirs.token, mine.token);
  const ps::Opened their_window = claim(other_grant_rogue, theirs.sequence, theirs.token);
  ASSERT_NE(their_window.window_rkey, 0u);
  EXPECT_EQ(refusal_of(other_grant_rogue,
                       other_grant_rogue.write(junk_mr, 0, {my_slot.addr, kBytes, their_window.window_rkey}, 0, kBytes,
                                               Signal::always)),
            "remote_access");
  victim.wait(victim.write_with_imm(gradient_mr, 0, my_slot, 0, 0, static_cast<std::uint32_t>(mine.sequence)), 30s);
  std::this_thread::sleep_for(300ms);  // the server takes the doorbell and closes the window
  EXPECT_EQ(refusal_of(victim, victim.write(junk_mr, 0, my_slot, 0, kBytes, Signal::always)), "remote_access")
      << "the key of a claim whose update arrived must be dead";
  apps.complete(mine.request, mine.part_index, 1us);
  apps.complete(theirs.request, theirs.part_index, 0us, /*failed=*/true);

  for (Connection* c : {&victim, &forger, &replayer, &ring_key_rogue, &other_grant_rogue, &bell_rogue}) {
    Connection leave = std::move(*c);
  }
  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(stats["claimed"].get<std::uint64_t>(), 2u) << "the victim's and the other grant's";
  EXPECT_EQ(stats["refused_claims"].get<std::uint64_t>(), 2u) << "the forged one and the replayed one";
  EXPECT_EQ(stats["refused_doorbells"].get<std::uint64_t>(), 1u) << "the rogue's doorbell";
  expect_moved_by_one_update(out, "a refused write or doorbell changed the model");
}

TEST_F(RogueWorkers, WithGrantWindowsAReplicasMirrorSlotOpensOnlyToItsClaimant) {
  // The replica's ring, written by the workers' mirrors, is opened by no key either: a worker
  // claims its mirror's slot with the token its server's grant carried (the replica learned
  // the server's key on connect). The victim (worker 1) is granted sequence 1; before it
  // mirrors, a rogue rings the replica's doorbell for it and writes the slot with the ring's
  // key, and another claims it with a forged token. Each is refused; the victim's mirror and
  // update land, its key at the replica dies with its doorbell, and the replica ends bitwise
  // equal to the server, moved by exactly the victim's update.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-replica-windows");
  const std::vector<std::string> shard = {
      "floats=" + std::to_string(kFloats), "slots=8", "workers=3", "updates=1", "out=" + out, "grant_windows=1"};
  auto node = [&](std::vector<std::string> head) {
    head.insert(head.begin(), GRADLANE_PS_NODE);
    head.insert(head.end(), shard.begin(), shard.end());
    return head;
  };
  ExternalProcess replica(node({"role=replica", "device=" + hosts[1].device, "port=7815"}), out + "/replica");
  ExternalProcess server(
      node({"role=server", "device=" + hosts[0].device, "port=7814", "replica=" + hosts[1].address + ":7815"}),
      out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto at_server = [&](std::uint32_t id) { return RogueWorkers::join(device, hosts[0].address, 7814, id); };
  auto at_replica = [&](std::uint32_t id) { return RogueWorkers::join(device, hosts[1].address, 7815, id); };
  auto [victim, slots] = at_server(1);
  auto [victim_mirror, mirror_ring] = at_replica(1);
  auto [rogue, ring1] = at_server(2);
  auto [rogue_mirror, ring2] = at_replica(2);
  auto [forger, ring3] = at_server(3);
  auto [forger_mirror, ring4] = at_replica(3);
  (void)ring1, (void)ring2, (void)ring3, (void)ring4;

  const Payloads payloads(device);
  const MemoryRegion &junk_mr = payloads.junk_mr, &gradient_mr = payloads.gradient_mr;

  victim.send(ps::encode(ps::Request{1, 0, 0}));
  const ps::Message answer = ps::decode(victim.receive(30s));
  ASSERT_TRUE(std::holds_alternative<ps::Grant>(answer));
  const ps::Grant mine = std::get<ps::Grant>(answer);
  ASSERT_EQ(mine.sequence, 1u);
  ASSERT_NE(mine.window_rkey, 0u);
  ASSERT_NE(mine.token, 0u) << "a windowed server's grant carries the token for the replica";
  const auto imm = static_cast<std::uint32_t>(mine.sequence);
  const std::uint64_t offset = (mine.sequence % 8) * kBytes;

  // Before the victim mirrors: a doorbell alone, a write with the ring's key, a forged claim.
  rogue_mirror.wait(rogue_mirror.write_with_imm(junk_mr, 0, mirror_ring, 0, 0, imm), 30s);
  EXPECT_EQ(refusal_of(rogue_mirror, rogue_mirror.write(junk_mr, 0, mirror_ring, offset, kBytes, Signal::always)),
            "remote_access");
  forger_mirror.send(ps::encode(ps::Claim{mine.sequence, mine.token ^ 1}));
  EXPECT_TRUE(dropped_within(forger_mirror, 10s)) << "the replica answered a claim with a forged token";
  std::this_thread::sleep_for(300ms);

  // The victim claims its mirror's slot, mirrors, rings; then writes the server's slot.
  victim_mirror.send(ps::encode(ps::Claim{mine.sequence, mine.token}));
  const ps::Message opened = ps::decode(victim_mirror.receive(30s));
  ASSERT_TRUE(std::holds_alternative<ps::Opened>(opened));
  const std::uint32_t mirror_key = std::get<ps::Opened>(opened).window_rkey;
  ASSERT_NE(mirror_key, 0u);
  EXPECT_NE(mirror_key, mirror_ring.rkey);
  const RegionDescriptor my_mirror{mirror_ring.addr + offset, kBytes, mirror_key};
  victim_mirror.wait(victim_mirror.write_and_ring(gradient_mr, 0, my_mirror, 0, kBytes, imm), 30s);
  victim.wait(victim.write_and_ring(gradient_mr, 0, {slots.addr + offset, kBytes, mine.window_rkey}, 0, kBytes, imm),
              30s);
  std::this_thread::sleep_for(300ms);  // the replica takes the doorbell and closes the window
  EXPECT_EQ(refusal_of(victim_mirror, victim_mirror.write(junk_mr, 0, my_mirror, 0, kBytes, Signal::always)),
            "remote_access")
      << "the key of a mirror claim whose mirror arrived must be dead";
  victim.send(ps::encode(ps::Bye{1}));
  victim.flush(30s);

  for (Connection* c : {&victim, &victim_mirror, &rogue, &rogue_mirror, &forger, &forger_mirror}) {
    Connection leave = std::move(*c);
  }
  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u);
  const auto replica_status = replica.wait_exit(60s);
  ASSERT_TRUE(replica_status.has_value()) << "the replica did not finish";
  std::ifstream replica_file(out + "/replica.stats.json");
  const json replica_stats = json::parse(replica_file);
  EXPECT_EQ(replica_stats["applied"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(replica_stats["claimed"].get<std::uint64_t>(), 1u) << "the victim's";
  EXPECT_EQ(replica_stats["refused_claims"].get<std::uint64_t>(), 1u) << "the forged one";
  EXPECT_EQ(replica_stats["refused_doorbells"].get<std::uint64_t>(), 1u) << "the rogue's doorbell";
  EXPECT_EQ(replica_stats["mirrors_fetched"].get<std::uint64_t>(), 0u) << "the victim's mirror was the one applied";
  expect_moved_by_one_update(out, "a refused write or doorbell changed the server's model");
  const auto server_model = read_model(out + "/server.model", kFloats),
             replica_model = read_model(out + "/replica.model", kFloats);
  EXPECT_EQ(std::memcmp(server_model.data(), replica_model.data(), kBytes), 0)
      << "a refused write or doorbell changed the replica's model";
}

}  // namespace
}  // namespace gradlane::testing
