// Connections on one shared CompletionQueue over real rxe: each connection gets its own
// arrivals from one poll, wait() sleeps until something comes (and says so when nothing does),
// and a peer that leaves fails only its own connection.
#include <gtest/gtest.h>

#include <thread>

#include "../common/pattern.hpp"
#include "harness.hpp"

namespace gradlane::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Polls the shared queue (sleeping in wait() between) until `conn` has a message.
std::string next_message(CompletionQueue& cq, Connection& conn, std::chrono::seconds limit) {
  const auto give_up = Clock::now() + limit;
  while (Clock::now() < give_up) {
    cq.poll();
    if (conn.has_pending_input()) {
      if (auto m = conn.try_receive()) return text_of(*m);
    }
    cq.wait(100ms);
  }
  return "<nothing>";
}

TEST(SharedCompletionQueue, EachConnectionGetsItsOwnArrivalsAndALeavingPeerFailsOnlyItsOwn) {
  const Device device = Device::open(selector_from_env());
  CompletionQueue cq(device);
  Listener listener(device, 0, test_options());
  listener.use_completion_queue(cq);
  const std::string port = std::to_string(listener.port());
  PeerProcess peer_a({listener.address(), port, "65536"});
  Connection a = listener.accept(30s);
  PeerProcess peer_b({listener.address(), port, "65536"});
  Connection b = listener.accept(30s);
  EXPECT_EQ(a.wait_region(1, 30s).length, 65536u);
  EXPECT_EQ(b.wait_region(1, 30s).length, 65536u);
  EXPECT_EQ(cq.connections(), 2u);

  // Idle: wait() sleeps its whole timeout and says nothing came.
  const auto idle_start = Clock::now();
  while (cq.poll() > 0) {
  }
  EXPECT_FALSE(cq.wait(300ms));
  EXPECT_GE(Clock::now() - idle_start, 250ms) << "wait() returned early with nothing to report";

  // Both peers write into one region of ours, each its half; each reply comes on its own connection.
  Buffer ours = Buffer::allocate(2 * 65536);
  MemoryRegion mr = MemoryRegion::register_buffer(device, ours, Access::remote_write);
  a.advertise(2, mr.descriptor());
  b.advertise(2, mr.descriptor());
  send_text(a, "push 2 0 65536 11");
  send_text(b, "push 2 65536 65536 22");
  EXPECT_EQ(next_message(cq, a, 30s), "ok");
  EXPECT_EQ(next_message(cq, b, 30s), "ok");
  EXPECT_EQ(check_pattern({ours.data(), 65536}, 11), std::nullopt);
  EXPECT_EQ(check_pattern({ours.data() + 65536, 65536}, 22), std::nullopt);

  // Peer a leaves: its connection fails (seen through the shared queue alone), b's does not.
  send_text(a, "exit");
  EXPECT_EQ(next_message(cq, a, 30s), "bye");
  const auto give_up = Clock::now() + 20s;
  while (!a.failed() && Clock::now() < give_up) {
    cq.poll();
    cq.wait(100ms);
  }
  EXPECT_TRUE(a.failed()) << "a's disconnect was not seen through the shared queue";
  EXPECT_FALSE(b.failed());
  send_text(b, "echo still here");
  EXPECT_EQ(next_message(cq, b, 30s), "still here");
  send_text(b, "exit");
  EXPECT_EQ(next_message(cq, b, 30s), "bye");
  ASSERT_TRUE(peer_a.wait_exit(10s).has_value());
  ASSERT_TRUE(peer_b.wait_exit(10s).has_value());
}

TEST(SharedReceiveQueue, BurstsFromManyConnectionsThroughSixteenSharedReceivesLoseNothing) {
  // Four peers each fire 40 doorbells (64-byte WRITEs with an immediate) and then 40 messages,
  // back to back, at a server whose connections share 16 receive buffers: the shared queue
  // runs dry, senders retry, and every doorbell and message must still reach its own
  // connection, in order, with the payload in place — from 16 buffers instead of 4 × 128.
  const Device device = Device::open(selector_from_env());
  const TransportOptions options = test_options();
  CompletionQueue cq(device, 1024, /*shared_receives=*/16, options.max_message_bytes);
  EXPECT_EQ(cq.shared_receives(), 16u);
  Listener listener(device, 0, options);
  listener.use_completion_queue(cq);
  const std::string port = std::to_string(listener.port());
  constexpr std::size_t kPeers = 4, kBurst = 40, kPiece = 64;
  std::vector<std::unique_ptr<PeerProcess>> peers;
  std::vector<Connection> conns;
  std::vector<Buffer> landing;
  std::vector<MemoryRegion> landing_mr;
  for (std::size_t k = 0; k < kPeers; ++k) {
    peers.push_back(std::make_unique<PeerProcess>(std::vector<std::string>{listener.address(), port, "65536"}));
    conns.push_back(listener.accept(30s));
    landing.push_back(Buffer::allocate(kBurst * kPiece));
    landing_mr.push_back(MemoryRegion::register_buffer(device, landing.back(), Access::remote_write));
    conns.back().advertise(2, landing_mr.back().descriptor());
    ASSERT_EQ(conns.back().wait_region(1, 30s).length, 65536u);
  }
  EXPECT_EQ(cq.receive_buffer_bytes(), 16u * (options.max_message_bytes + 12))
      << "no connection on a shared receive queue keeps receive buffers of its own";

  for (std::size_t k = 0; k < kPeers; ++k)
    send_text(conns[k], "burst " + std::to_string(kBurst) + " 2 " + std::to_string(1000 * (k + 1)));
  // Nobody reposts for a second: the 16 shared buffers fill and the peers' next writes are
  // refused "receiver not ready" and retried, until the loop below takes them.
  std::this_thread::sleep_for(1s);
  const auto draining = Clock::now();
  std::vector<std::vector<std::uint32_t>> bells(kPeers);
  std::vector<std::vector<std::string>> texts(kPeers);
  const auto give_up = Clock::now() + 120s;
  const auto done = [&] {
    for (std::size_t k = 0; k < kPeers; ++k) {
      if (bells[k].size() < kBurst || texts[k].size() < kBurst + 1) return false;
    }
    return true;
  };
  while (!done() && Clock::now() < give_up) {
    cq.poll();
    for (std::size_t k = 0; k < kPeers; ++k) {
      while (auto d = conns[k].try_doorbell()) bells[k].push_back(d->imm);
      while (auto m = conns[k].try_receive()) texts[k].push_back(text_of(*m));
    }
  }
  // Each refusal costs its sender the receiver-not-ready delay (0.64 ms; 655 ms before it was set).
  std::printf(
      "  [measured] %zu doorbells and %zu messages taken %lld ms after the loop began to repost\n", kPeers * kBurst,
      kPeers * (kBurst + 1),
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - draining).count()));
  for (std::size_t k = 0; k < kPeers; ++k) {
    const std::uint32_t tag = static_cast<std::uint32_t>(1000 * (k + 1));
    ASSERT_EQ(bells[k].size(), kBurst) << "peer " << k;
    ASSERT_EQ(texts[k].size(), kBurst + 1) << "peer " << k;
    for (std::size_t i = 0; i < kBurst; ++i) {
      EXPECT_EQ(bells[k][i], tag + i) << "peer " << k << " doorbell " << i;
      EXPECT_EQ(texts[k][i], std::to_string(tag + i)) << "peer " << k << " message " << i;
      EXPECT_EQ(check_pattern({landing[k].data() + i * kPiece, kPiece}, tag + i), std::nullopt)
          << "peer " << k << " payload " << i;
    }
    EXPECT_EQ(texts[k][kBurst], "sent " + std::to_string(kBurst));
    EXPECT_FALSE(conns[k].failed());
  }
  for (std::size_t k = 0; k < kPeers; ++k) {
    send_text(conns[k], "exit");
    EXPECT_EQ(next_message(cq, conns[k], 30s), "bye");
    ASSERT_TRUE(peers[k]->wait_exit(10s).has_value());
  }
}

TEST(SharedReceiveQueue, AConnectionWithLargerMessagesThanItsBuffersIsRefused) {
  const Device device = Device::open(selector_from_env());
  TransportOptions options = test_options();
  CompletionQueue cq(device, 1024, 8, /*max_message_bytes=*/1024);
  Listener listener(device, 0, options);
  options.max_message_bytes = 4096;
  try {
    connect(device, listener.address(), listener.port(), options, cq);
    ADD_FAILURE() << "a connection whose messages do not fit the shared buffers was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("max_message_bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradlane::testing
