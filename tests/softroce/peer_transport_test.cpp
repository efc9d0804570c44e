// gradlaned's link to a peer sidecar (sidecar/peer/rdma_peer_transport) when that peer is
// stopped (SIGSTOP): its receive queue fills, RDMA retries our SENDs' RNR NAKs forever, and
// the daemon's loop — which calls send() and receive() — must never wait on it. Over real rxe,
// with the softroce peer process standing in for the other sidecar.
#include <signal.h>

#include <algorithm>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "harness.hpp"
#include "sidecar/peer/rdma_peer_transport.hpp"

namespace gradlane::testing {
namespace {

using Clock = std::chrono::steady_clock;

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
  // --peer does. take_joined() admits it without blocking the loop, on a new index; the dead
  // link, once reported, has given its connection back.
  const Device device = Device::open(selector_from_env());
  constexpr std::uint16_t kPort = 7697;
  std::optional<PeerProcess> peer(std::in_place,
                                  std::vector<std::string>{softroce_env().address, std::to_string(kPort), "4096"});
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
  EXPECT_EQ(transport.live_links(), 0u) << "the reported link still holds its connection";
  EXPECT_FALSE(transport.describe(0).empty()) << "a released link is still named in messages";

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
  EXPECT_EQ(transport.live_links(), 1u);
  EXPECT_LT(slowest_call, 1.0) << "admitting blocked the loop for " << slowest_call << " s";
  EXPECT_FALSE(transport.send(0, bytes_of("echo old"))) << "the dead link took a message";
  ASSERT_TRUE(transport.send(1, bytes_of("echo back")));
  EXPECT_EQ(reply_from(1, 30s), "back");
  ASSERT_TRUE(transport.send(1, bytes_of("exit")));
  EXPECT_EQ(reply_from(1, 30s), "bye");
  EXPECT_TRUE(peer->wait_exit(10s).has_value());
}

// The other way round: this sidecar made the link (--peer), and the peer — the listening side —
// restarts. The link is made again in the background; take_joined() reports it on a new index,
// and no call blocks the loop while the peer is gone or coming back. Both sidecars' transports
// live in this process, on the one rxe device: A listens, B dials A.
TEST(PeerTransport, ALinkThisSidecarMadeIsMadeAgainWhenItsListeningPeerRestarts) {
  const Device device = Device::open(selector_from_env());
  constexpr std::uint16_t kPortA = 7699, kPortB = 7700;
  const auto listening_a = [&] {
    return std::make_unique<peer::RdmaPeerTransport>(device, kPortA, std::vector<peer::PeerAddress>{}, 0, 60s,
                                                     test_options());
  };
  // Polls A's listener until B's dial (blocking, in B's constructor or in its redialer) is taken.
  const auto admit = [&](peer::RdmaPeerTransport& a) {
    std::vector<peer::PeerIndex> joined;
    for (const auto give_up = Clock::now() + 30s; joined.empty() && Clock::now() < give_up;) joined = a.take_joined();
    return joined;
  };
  const auto message_on = [](peer::RdmaPeerTransport& t, peer::PeerIndex index, std::chrono::seconds limit) {
    for (const auto give_up = Clock::now() + limit; Clock::now() < give_up;) {
      if (auto m = t.receive(); m && m->first == index) return text_of(m->second);
    }
    return std::string("<nothing>");
  };
  auto a = listening_a();
  auto dialing = std::async(std::launch::async, [&] {
    return std::make_unique<peer::RdmaPeerTransport>(
        device, kPortB, std::vector<peer::PeerAddress>{{softroce_env().address, kPortA}}, 0, 60s, test_options());
  });
  ASSERT_EQ(admit(*a), std::vector<peer::PeerIndex>{0});
  auto b = dialing.get();
  ASSERT_TRUE(b->send(0, bytes_of("first")));
  ASSERT_EQ(message_on(*a, 0, 30s), "first");

  a.reset();  // A's gradlaned is gone: its listener and its end of the link
  double slowest_call = 0;
  const auto timed = [&](auto call) {
    const auto t = Clock::now();
    auto result = call();
    slowest_call = std::max(slowest_call, seconds_since(t));
    return result;
  };
  std::vector<peer::PeerIndex> failed;
  for (const auto gone = Clock::now(); failed.empty() && seconds_since(gone) < 20.0;) {
    (void)timed([&] { return b->send(0, bytes_of("anyone?")); });
    (void)timed([&] { return b->receive().has_value(); });
    failed = timed([&] { return b->take_failed(); });
  }
  ASSERT_EQ(failed, std::vector<peer::PeerIndex>{0}) << "B never saw its link to the departed A fail";
  // Nothing listens for a while: B's attempts are refused in the background.
  for (const auto down = Clock::now(); seconds_since(down) < 1.5;) {
    EXPECT_TRUE(timed([&] { return b->take_joined(); }).empty()) << "a link to nobody";
    (void)timed([&] { return b->receive().has_value(); });
  }

  a = listening_a();  // A restarts on its address
  std::vector<peer::PeerIndex> b_joined, a_joined;
  for (const auto back = Clock::now(); (b_joined.empty() || a_joined.empty()) && seconds_since(back) < 30.0;) {
    if (a_joined.empty()) a_joined = a->take_joined();
    if (b_joined.empty()) b_joined = timed([&] { return b->take_joined(); });
    (void)timed([&] { return b->receive().has_value(); });
  }
  ASSERT_EQ(a_joined, std::vector<peer::PeerIndex>{0}) << "the restarted A was never dialed again";
  ASSERT_EQ(b_joined, std::vector<peer::PeerIndex>{1}) << "B did not report its new link";
  EXPECT_LT(slowest_call, 1.0) << "one of B's calls blocked its loop for " << slowest_call << " s";
  RecordProperty("slowest_call_while_redialing_s", std::to_string(slowest_call));
  EXPECT_FALSE(b->send(0, bytes_of("old"))) << "the dead link took a message";
  ASSERT_TRUE(b->send(1, bytes_of("again")));
  EXPECT_EQ(message_on(*a, 0, 30s), "again");
  ASSERT_TRUE(a->send(0, bytes_of("welcome back")));
  EXPECT_EQ(message_on(*b, 1, 30s), "welcome back");
}

}  // namespace
}  // namespace gradlane::testing
