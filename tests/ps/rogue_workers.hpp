// RogueWorkers: hand-driven workers for the Soft-RoCE tests — the test process speaks the
// shard's protocol itself, so it can also misbehave on purpose — and what those tests share.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
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

using namespace std::chrono_literals;
using nlohmann::json;

class RogueWorkers : public ::testing::Test {
 protected:
  static constexpr std::size_t kFloats = 1024, kBytes = kFloats * sizeof(float);

  // Connects as worker `id`: the server's (or the replica's) slot ring as it advertised it,
  // then our hello.
  static std::pair<Connection, RegionDescriptor> join(const Device& device, const std::string& address,
                                                      std::uint16_t port, std::uint32_t id,
                                                      ps::Addressed as = ps::Addressed::server) {
    Connection c = ps::connect_with_retry(device, address, port, TransportOptions{}, 30s);
    const RegionDescriptor slots = c.wait_region(ps::kSlotRegionId, 30s);
    c.send(ps::encode(ps::Hello{ps::PeerKind::worker, id, as}));
    return {std::move(c), slots};
  }

  // Whether `c`'s peer dropped it: the next receive, within `within`, fails (printed) instead of
  // bringing a message.
  static bool dropped_within(Connection& c, std::chrono::milliseconds within) {
    try {
      (void)c.receive(within);
      return false;
    } catch (const Error& e) {
      std::printf("  [dropped] %s\n", e.what());
      return true;
    }
  }

  // The server's stats once it finished (every worker gone), after a clean exit.
  static json finished_stats(ExternalProcess& server, const std::string& out) {
    const auto status = server.wait_exit(60s);
    EXPECT_TRUE(status.has_value()) << "the server did not finish";
    EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    std::ifstream stats_file(out + "/server.stats.json");
    return json::parse(stats_file);
  }

  // A fresh output directory under GRADLANE_OUT_DIR.
  static std::string fresh_out(const char* name) {
    const std::string out = std::string(std::getenv("GRADLANE_OUT_DIR")) + "/" + name;
    std::filesystem::remove_all(out);
    std::filesystem::create_directories(out);
    return out;
  }

  // What a rogue writes (1e30s) and what an honest worker pushes (1.0s), registered on `device`.
  struct Payloads {
    explicit Payloads(const Device& device)
        : junk(filled(1e30F)),
          gradient(filled(1.0F)),
          junk_mr(MemoryRegion::register_buffer(device, junk, Access::local)),
          gradient_mr(MemoryRegion::register_buffer(device, gradient, Access::local)) {}
    static Buffer filled(float value) {
      Buffer b = Buffer::allocate(kBytes);
      std::fill_n(reinterpret_cast<float*>(b.data()), kFloats, value);
      return b;
    }
    Buffer junk, gradient;  // before the regions: they outlive them
    MemoryRegion junk_mr, gradient_mr;
  };

  // The model moved by exactly `updates` updates of 1.0s from the initial one.
  static void expect_moved_by_one_update(const std::string& out, const char* otherwise, int updates = 1) {
    std::vector<float> expected(kFloats, examples::initial_value(0)), one(kFloats, 1.0F);
    for (int i = 0; i < updates; ++i) ps::sgd_step(expected, one, examples::kLearningRate);
    const auto model = read_model(out + "/server.model", kFloats);
    EXPECT_EQ(std::memcmp(model.data(), expected.data(), kBytes), 0) << otherwise;
  }

  // The job's apps on host 2 (endpoint 2), attached to the server's gradlaned at `shm`, and a
  // grant from it for a shard-sized push to the server (endpoint 0).
  static sidecar::Client attach_apps(const std::string& shm) {
    sidecar::AttachOptions attach;
    attach.shm_name = shm;
    attach.job = 1;
    attach.endpoint = 2;
    attach.region_bytes = kBytes;
    return sidecar::Client::attach(attach);
  }
  static sidecar::Grant grant_from(sidecar::Client& apps, bool windows) {
    apps.request({.tensor = 1, .receiver = 0, .bytes = kBytes});
    const sidecar::Grant g = apps.wait(30s);
    EXPECT_EQ(g.kind, sidecar::GrantKind::go) << sidecar::reason_name(g.reason);
    EXPECT_EQ(g.token != 0, windows) << "a grant carries a token exactly when its server binds grant windows";
    return g;
  }
  // A claim of `sequence` with `token` on `c`, and the server's answer.
  static ps::Opened claim(Connection& c, std::uint64_t sequence, std::uint64_t token) {
    c.send(ps::encode(ps::Claim{sequence, token}));
    const ps::Message answer = ps::decode(c.receive(30s));
    EXPECT_TRUE(std::holds_alternative<ps::Opened>(answer));
    return std::get<ps::Opened>(answer);
  }

  // A granter (server or direct-mode aggregator, at `address`:`port`, ring of kLateSlots slots,
  // hole_timeout 500 ms) and two hand-driven workers: worker 2 lets its grant be skipped, then
  // writes junk into that slot between each of worker 1's writes and its doorbell, as a
  // stalled or retransmitted write would land. No sequence may reuse the slot until worker 2
  // asks again (its request arrives behind any write of its own); then it pushes for real,
  // and the slot is in use again.
  static constexpr std::uint64_t kLateSlots = 4;
  struct LateWriter {
    LateWriter(const Device& device, const std::string& address, std::uint16_t port)
        : honest(join(device, address, port, 1)), late(join(device, address, port, 2)), payloads(device) {}

    // Request and the grant; what became of earlier members (an aggregator says) is skipped.
    static ps::Grant grant_for(Connection& c, std::uint32_t id) {
      c.send(ps::encode(ps::Request{id, 0, 0}));
      for (;;) {
        const ps::Message answer = ps::decode(c.receive(30s));
        if (std::holds_alternative<ps::Forwarded>(answer)) continue;
        EXPECT_TRUE(std::holds_alternative<ps::Grant>(answer));
        return std::get<ps::Grant>(answer);
      }
    }
    static std::uint64_t slot_at(std::uint64_t sequence) { return (sequence % kLateSlots) * kBytes; }

    // Worker 1's push of 1.0s in two steps (the data, then a doorbell alone), `between` in
    // between; its sequence.
    template <class Between>
    std::uint64_t push(const Between& between) {
      Connection& c = honest.first;
      const ps::Grant g = grant_for(c, 1);
      c.wait(c.write(payloads.gradient_mr, 0, honest.second, slot_at(g.sequence), kBytes, Signal::always), 30s);
      between();
      c.wait(c.write_with_imm(payloads.gradient_mr, 0, honest.second, 0, 0, static_cast<std::uint32_t>(g.sequence)),
             30s);
      return g.sequence;
    }

    // The whole run; the updates pushed (worker 1's and worker 2's one), both workers gone.
    std::uint64_t push_around_it() {
      Connection& c = late.first;
      const ps::Grant skipped = grant_for(c, 2);
      std::this_thread::sleep_for(1500ms);  // past the hole timeout: skipped
      const std::uint64_t held = skipped.sequence % kLateSlots;
      const auto late_write = [&] {
        c.wait(c.write(payloads.junk_mr, 0, honest.second, slot_at(skipped.sequence), kBytes, Signal::always), 30s);
      };
      std::uint64_t updates = 0;
      for (; updates < 2 * kLateSlots; ++updates) {
        const std::uint64_t sequence = push(late_write);
        EXPECT_NE(sequence % kLateSlots, held) << "sequence " << sequence << " reuses the slot of skipped sequence "
                                               << skipped.sequence << " before its worker asked again";
      }
      const ps::Grant again = grant_for(c, 2);
      c.wait(c.write_and_ring(payloads.gradient_mr, 0, honest.second, slot_at(again.sequence), kBytes,
                              static_cast<std::uint32_t>(again.sequence)),
             30s);
      ++updates;
      bool reused = again.sequence % kLateSlots == held;
      for (std::uint64_t i = 0; i < kLateSlots; ++i, ++updates) reused |= push([] {}) % kLateSlots == held;
      EXPECT_TRUE(reused) << "the slot stays out of use after its worker asked again";
      for (std::uint32_t id : {1U, 2U}) {
        Connection& worker = id == 1 ? honest.first : late.first;
        worker.send(ps::encode(ps::Bye{id}));
        worker.flush(30s);
      }
      std::this_thread::sleep_for(500ms);  // let the granter take all of it before we leave
      { Connection leave = std::move(honest.first); }
      { Connection leave = std::move(late.first); }
      return updates;
    }

    std::pair<Connection, RegionDescriptor> honest, late;
    Payloads payloads;
  };
};

}  // namespace gradlane::testing
