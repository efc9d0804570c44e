// A direct-mode aggregator whose links fail over rxe (`ci/softroce.sh --hosts 3`), as the fault
// list's link:2 in aggregate mode does:
//   - a member whose host falls silent (no process exit, so no disconnect ever comes) is lost
//     within the probe's second plus the ACK timeout, and the aggregator finishes instead of
//     waiting for it for good;
//   - a forward cut off from its server (no replica) connects to the job again once the link
//     is back (AggregatorOptions::rejoin_within): the member it was forwarding is reported not
//     delivered, and the next one is applied at the server. The link comes back once the
//     server has lost host 2, an event, not after a time a loaded machine could outrun.
// A host falls silent by netem dropping every packet on its link, both ways.
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradlane/gradlane.hpp"

#include "../common/external_process.hpp"
#include "../common/hosts.hpp"
#include "link_faults.hpp"
#include "server_thread.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kFloats = 64;

ps::AggregatorOptions aggregator_of(const Host& server, std::uint16_t port) {
  ps::AggregatorOptions o;
  o.id = 9;
  o.server = {server.address, port};
  o.floats = kFloats;
  o.group = 1;
  o.timeout = 30s;
  return o;
}

TEST(CutOffAggregator, AMemberWhoseHostFallsSilentIsLostAndTheAggregatorFinishes) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::uint16_t kServerPort = 7940, kAggregatorPort = 7941;
  ServerThread server(hosts[0], kServerPort, 1, kFloats);  // the aggregator's forward
  std::atomic<bool> admitted{false}, finished{false};
  std::atomic<std::uint64_t> lost{0};
  std::string aggregator_failure;
  std::jthread aggregator_thread([&] {
    try {
      Device device = Device::open({.name = hosts[2].device});
      ps::Aggregator aggregator(device, kAggregatorPort, aggregator_of(hosts[0], kServerPort));
      aggregator.accept_workers(1, 60s);
      admitted = true;
      for (const auto give_up = Clock::now() + 30s; !aggregator.finished() && Clock::now() < give_up;) {
        if (aggregator.progress() == 0) std::this_thread::sleep_for(100us);
        lost = aggregator.stats().peers_lost;
      }
      finished = aggregator.finished();
    } catch (const std::exception& e) {
      aggregator_failure = e.what();
    }
  });
  // The member: a worker's connection from host 1 that says hello, then its host falls silent
  // while its process lives on.
  Device device = Device::open({.name = hosts[1].device});
  Connection member = ps::connect_with_retry(device, hosts[2].address, kAggregatorPort, TransportOptions{}, 30s);
  (void)member.wait_region(ps::kSlotRegionId, 30s);
  member.send(ps::encode(ps::Hello{ps::PeerKind::worker, 1}));
  for (const auto give_up = Clock::now() + 30s; !admitted.load() && Clock::now() < give_up;) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(admitted.load()) << aggregator_failure;
  std::optional<SilentHost> silent;
  silent.emplace(1);
  const auto start = Clock::now();
  aggregator_thread.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  silent.reset();
  server.stop();
  EXPECT_EQ(aggregator_failure, "");
  EXPECT_EQ(server.failure, "");
  EXPECT_TRUE(finished.load()) << "the aggregator still waited for its silent member after 30 s";
  EXPECT_EQ(lost.load(), 1u);
  std::printf("silent member lost, aggregator finished, after %.2f s\n", seconds);
}

TEST(CutOffAggregator, AForwardCutOffFromItsServerRejoinsTheJobAndForwardsAgain) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::uint16_t kServerPort = 7942, kAggregatorPort = 7943;
  ServerThread server(hosts[0], kServerPort, 2, kFloats);  // the aggregator's forward and the worker
  std::atomic<bool> stop{false}, admitted{false};
  std::atomic<std::uint64_t> rejoins{0};
  std::string aggregator_failure;
  std::jthread aggregator_thread([&] {
    try {
      Device device = Device::open({.name = hosts[2].device});
      ps::AggregatorOptions o = aggregator_of(hosts[0], kServerPort);
      o.rejoin_within = 60s;
      ps::Aggregator aggregator(device, kAggregatorPort, o);
      aggregator.accept_workers(1, 60s);
      admitted = true;
      while (!stop.load()) {
        if (aggregator.progress() == 0) std::this_thread::sleep_for(100us);
        rejoins = aggregator.stats().rejoins;
      }
    } catch (const std::exception& e) {
      aggregator_failure = e.what();
    }
  });
  // The worker shares the aggregator's host 2: only the forward's path to host 0 is cut.
  Device device = Device::open({.name = hosts[2].device});
  ps::WorkerOptions w;
  w.id = 1;
  w.server = {hosts[0].address, kServerPort};
  w.aggregator = ps::Endpoint{hosts[2].address, kAggregatorPort};
  w.floats = kFloats;
  w.timeout = 60s;
  std::optional<ps::Worker> worker;
  // Pushes step `tag` through the aggregator and waits up to 60 s for its outcome.
  const auto push = [&](std::uint64_t tag) -> std::optional<ps::MemberOutcome> {
    std::fill(worker->gradient().begin(), worker->gradient().end(), static_cast<float>(tag));
    const ps::PushResult pushed = worker->push(0, tag);
    if (!pushed.pending) return std::nullopt;
    for (const auto give_up = Clock::now() + 60s; Clock::now() < give_up;) {
      for (const ps::MemberOutcome& o : worker->take_member_outcomes()) {
        if (o.tag == tag) return o;
      }
      std::this_thread::sleep_for(1ms);
    }
    return std::nullopt;
  };
  std::optional<ps::MemberOutcome> before, cut_off, after;
  try {
    worker.emplace(device, w);
    for (const auto give_up = Clock::now() + 30s; !admitted.load() && Clock::now() < give_up;) {
      std::this_thread::sleep_for(1ms);
    }
    before = push(1);
    {
      SilentHost silent(0);
      // The forward of step 2 fails within the ACK timeout; the aggregator then tries to
      // connect again until the link is back: once the server has lost both host 2's
      // connections (its probes failed, as the forward's write does), not after a fixed time.
      std::jthread push_while_cut_off([&] { cut_off = push(2); });
      for (const auto give_up = Clock::now() + 60s; server.peers_lost.load() < 2 && Clock::now() < give_up;) {
        std::this_thread::sleep_for(10ms);
      }
      EXPECT_GE(server.peers_lost.load(), 2u) << "the server never lost host 2 behind its silent link";
      std::this_thread::sleep_for(1s);  // past the forward's own failure, which began first
      silent.speak();
    }
    after = push(3);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "worker: " << e.what();
  }
  worker.reset();
  stop = true;
  aggregator_thread.join();
  server.stop();
  EXPECT_EQ(aggregator_failure, "") << "the aggregator failed instead of rejoining";
  EXPECT_EQ(server.failure, "");
  EXPECT_EQ(rejoins.load(), 1u);
  ASSERT_TRUE(before.has_value() && after.has_value() && cut_off.has_value()) << "a push had no outcome";
  EXPECT_TRUE(before->delivered);
  EXPECT_FALSE(cut_off->delivered) << "the member forwarded while cut off was reported delivered";
  EXPECT_TRUE(after->delivered) << "the rejoined forward did not deliver";
  std::vector<std::uint64_t> applied;
  for (const auto& u : server.history) {
    if (!u.skipped) applied.push_back(u.sequence);
  }
  EXPECT_EQ(applied, (std::vector<std::uint64_t>{before->sequence, after->sequence}))
      << "the server applied other than the two delivered forwards";
}

}  // namespace
}  // namespace gradlane::testing
