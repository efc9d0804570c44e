// gradlaned's link to a peer sidecar (sidecar/peer/rdma_peer_transport) when that peer is
// stopped (SIGSTOP): its receive queue fills, RDMA retries our SENDs' RNR NAKs forever, and
// the daemon's loop — which calls send() and receive() — must never wait on it. Over real rxe,
// with the softroce peer process standing in for the other sidecar.
#include <signal.h>

#include <algorithm>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "harness.hpp"
#include "sidecar/peer/rdma_peer_transport.hpp"

namespace gradlane::testing {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s)); }

// More than the peer's receive queue (128) and our control slots (32) hold together.
constexpr int kMessages = 400;

TEST(PeerTransport, StoppedPeerNeverBlocksTheLoopAndIsDroppedAfterTheStallLimit) {
  const Device device = Device::open(selector_from_env());
  constexpr std::uint16_t kPort = 7695;
  // The peer retries its connect until the transport listens.
  PeerProcess peer({softroce_env().address, std::to_string(kPort), "4096"});
  peer::RdmaPeerTransport transport(device, kPort, {}, /*expect_inbound=*/1, 60s, test_options(), /*stall_limit=*/3s);
  ASSERT_EQ(transport.peer_count(), 1u);

  double slowest_call = 0;  // seconds, over every send()/receive() while the peer is stopped
  const auto timed = [&](auto call) {
    const auto t = Clock::now();
    auto result = call();
    slowest_call = std::max(slowest_call, seconds_since(t));
    return result;
  };
  // Collects the peer's echo replies, in order, for up to `limit`.
  const auto replies = [&](int count, std::chrono::seconds limit) {
    std::vector<std::string> got;
    const auto give_up = Clock::now() + limit;
    while (static_cast<int>(got.size()) < count && Clock::now() < give_up) {
      if (auto m = transport.receive()) got.push_back(text_of(m->second));
    }
    return got;
  };

  ASSERT_TRUE(transport.send(0, bytes_of("echo hello")));
  ASSERT_EQ(replies(1, 30s), std::vector<std::string>{"hello"});

  // 1. Stopped for a while (under the stall limit): every call returns at once, nothing is lost.
  ASSERT_EQ(::kill(peer.pid(), SIGSTOP), 0);
  std::size_t refused = 0;
  for (int i = 0; i < kMessages; ++i) {
    refused += !timed([&] { return transport.send(0, bytes_of("echo " + std::to_string(i))); });
    (void)timed([&] { return transport.receive().has_value(); });
  }
  EXPECT_EQ(refused, 0u) << "send() gave up on a peer stopped for less than the stall limit";
  EXPECT_TRUE(transport.take_failed().empty());
  EXPECT_LT(slowest_call, 1.0) << "one call blocked the loop for " << slowest_call << " s";
  RecordProperty("slowest_call_while_stopped_s", std::to_string(slowest_call));
  ASSERT_EQ(::kill(peer.pid(), SIGCONT), 0);
  const auto echoed = replies(kMessages, 60s);
  ASSERT_EQ(echoed.size(), static_cast<std::size_t>(kMessages)) << "messages lost across the stop";
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(echoed[i], std::to_string(i)) << "out of order at " << i;

  // 2. Stopped beyond the stall limit: the link is reported failed, still without blocking.
  ASSERT_EQ(::kill(peer.pid(), SIGSTOP), 0);
  slowest_call = 0;
  const auto stopped = Clock::now();
  for (int i = 0; i < kMessages; ++i) (void)timed([&] { return transport.send(0, bytes_of("echo late")); });
  std::vector<peer::PeerIndex> failed;
  while (failed.empty() && seconds_since(stopped) < 30.0) {
    (void)timed([&] { return transport.receive().has_value(); });
    failed = transport.take_failed();
  }
  const double dropped_after = seconds_since(stopped);
  EXPECT_EQ(failed, std::vector<peer::PeerIndex>{0}) << "a peer stopped for 30 s was never dropped";
  EXPECT_GE(dropped_after, 3.0) << "dropped before its stall limit";
  EXPECT_LT(slowest_call, 1.0) << "one call blocked the loop for " << slowest_call << " s";
  EXPECT_FALSE(transport.send(0, bytes_of("echo after"))) << "a failed link accepted a message";
  RecordProperty("stopped_peer_dropped_after_s", std::to_string(dropped_after));
  ::kill(peer.pid(), SIGCONT);
  peer.kill_hard();
}

TEST(PeerTransport, APeerSidecarThatComesBackIsAdmittedOnANewLink) {
  // The peer is killed; a new one connects to the same port, as a restarted gradlaned with
  // --peer does. take_joined() admits it without blocking the loop, on a new index.
  const Device device = Device::open(selector_from_env());
  constexpr std::uint16_t kPort = 7697;
  std::optional<PeerProcess> peer(std::in_place, std::vector<std::string>{softroce_env().address, std::to_string(kPort), "4096"});
  peer::RdmaPeerTransport transport(device, kPort, {}, /*expect_inbound=*/1, 60s, test_options());
  ASSERT_EQ(transport.peer_count(), 1u);
  const auto reply_from = [&](peer::PeerIndex index, std::chrono::seconds limit) -> std::string {
    const auto give_up = Clock::now() + limit;
    while (Clock::now() < give_up) {
      if (auto m = transport.receive(); m && m->first == index) return text_of(m->second);
    }
    return "<nothing>";
  };
  ASSERT_TRUE(transport.send(0, bytes_of("echo first")));
  ASSERT_EQ(reply_from(0, 30s), "first");

  peer->kill_hard();
  std::vector<peer::PeerIndex> failed;
  const auto killed = Clock::now();
  while (failed.empty() && seconds_since(killed) < 20.0) {
    (void)transport.receive();
    failed = transport.take_failed();
    EXPECT_TRUE(transport.take_joined().empty()) << "nothing connected yet";
  }
  ASSERT_EQ(failed, std::vector<peer::PeerIndex>{0}) << "the killed peer's link was not reported failed";

  peer.emplace(std::vector<std::string>{softroce_env().address, std::to_string(kPort), "4096"});
  std::vector<peer::PeerIndex> joined;
  double slowest_call = 0;
  const auto restarted = Clock::now();
  while (joined.empty() && seconds_since(restarted) < 30.0) {
    const auto t = Clock::now();
    joined = transport.take_joined();
    (void)transport.receive();
    slowest_call = std::max(slowest_call, seconds_since(t));
  }
  ASSERT_EQ(joined, std::vector<peer::PeerIndex>{1}) << "the returning peer was not admitted";
  EXPECT_EQ(transport.peer_count(), 2u);
  EXPECT_LT(slowest_call, 1.0) << "admitting blocked the loop for " << slowest_call << " s";
  EXPECT_FALSE(transport.send(0, bytes_of("echo old"))) << "the dead link took a message";
  ASSERT_TRUE(transport.send(1, bytes_of("echo back")));
  EXPECT_EQ(reply_from(1, 30s), "back");
  ASSERT_TRUE(transport.send(1, bytes_of("exit")));
  EXPECT_EQ(reply_from(1, 30s), "bye");
  EXPECT_TRUE(peer->wait_exit(10s).has_value());
}

}  // namespace
}  // namespace gradlane::testing
