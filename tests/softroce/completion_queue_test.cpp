// Connections on one shared CompletionQueue over real rxe: each connection gets its own
// arrivals from one poll, wait() sleeps until something comes (and says so when nothing does),
// and a peer that leaves fails only its own connection.
#include <gtest/gtest.h>

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
  while (cq.poll() > 0) {}
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

}  // namespace
}  // namespace gradlane::testing
