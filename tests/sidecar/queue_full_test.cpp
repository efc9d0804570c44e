// Full queues in both directions: the client is told (resource_exhausted) or waits within its
// bound, and every entry that was accepted is answered exactly once.
#include <gtest/gtest.h>

#include <chrono>
#include <set>

#include "harness.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

TEST(SidecarQueueFull, FullRequestQueueFailsLoudlyAndLosesNothing) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  Client client = Client::attach(test_attach(name));
  driver.pause();  // the daemon reads nothing until the test steps it

  std::set<std::uint64_t> queued;
  for (std::uint32_t i = 0; i < shm::kRingCapacity; ++i) queued.insert(client.request(small_update()));
  try {
    client.request(small_update());
    FAIL() << "a request was accepted into a full queue";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::resource_exhausted);
    EXPECT_NE(std::string(e.what()).find("nothing was queued"), std::string::npos) << e.what();
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(client.request(small_update(), 20ms), Error);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms) << "wait_for_space must be honoured";

  std::set<std::uint64_t> answered;
  for (int steps = 0; answered.size() < queued.size() && steps < 1000; ++steps) {
    driver.step();
    while (auto g = client.poll()) {
      EXPECT_EQ(g->kind, GrantKind::go);
      EXPECT_TRUE(answered.insert(g->request).second) << "answered twice: " << g->request;
    }
  }
  EXPECT_EQ(answered, queued);
}

TEST(SidecarQueueFull, UnreadGrantsBackpressureWithoutLoss) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  Client client = Client::attach(test_attach(name));
  driver.pause();

  // Keep requesting without reading grants: the grant queue fills, then the daemon's outbox,
  // then the daemon stops reading, and finally the request queue is full.
  std::set<std::uint64_t> queued;
  for (int round = 0; round < 100; ++round) {
    try {
      for (;;) queued.insert(client.request(small_update()));
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), Errc::resource_exhausted);
    }
    if (driver.step() == 0) break;  // the daemon takes nothing more: backpressure reached us
  }
  EXPECT_GT(queued.size(), std::size_t{2} * shm::kRingCapacity);
  EXPECT_LT(queued.size(), std::size_t{4} * shm::kRingCapacity) << "the daemon must stop taking requests";

  std::set<std::uint64_t> answered;
  for (int steps = 0; answered.size() < queued.size() && steps < 10000; ++steps) {
    while (auto g = client.poll()) {
      EXPECT_EQ(g->kind, GrantKind::go);
      EXPECT_TRUE(answered.insert(g->request).second);
    }
    driver.step();
  }
  EXPECT_EQ(answered, queued);
  EXPECT_EQ(client.outstanding(), 0U);
}

}  // namespace
}  // namespace gradlane::sidecar::test
