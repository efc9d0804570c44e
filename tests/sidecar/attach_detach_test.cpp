// The attach lifecycle's edges: an app that detaches and exits at once is a clean detach,
// however soon the liveness sweep notices its exit; an app attaching from a NIC the daemon does
// not serve is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "harness.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

TEST(SidecarDetach, DetachThenExitCountsAsDetachedNeverReclaimed) {
  // step() runs the liveness sweep before it looks at attach/detach claims. An app that
  // detached and exited between two steps is dead by the sweep's look; it must still count as
  // detached (and have its last completions taken), never as a dead app reclaimed.
  constexpr std::uint64_t kRounds = 200;
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  driver.pause();  // the test steps the daemon by hand
  const DaemonStats& stats = driver.daemon().stats();
  for (std::uint64_t round = 0; round < kRounds; ++round) {
    Child child("app-detach", {"--shm=" + name});
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (stats.attached == round) {
      driver.step();
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "round " << round << ": the child never attached";
    }
    ASSERT_EQ(child.wait_exit(5s), 0) << "round " << round << ": the child did not detach and exit cleanly";
    driver.step_far_ahead();  // the sweep (first in step()) sees the exited app
    driver.step();
    ASSERT_EQ(stats.reclaimed, 0U) << "round " << round << ": a clean detach was counted as a death";
  }
  EXPECT_EQ(stats.attached, kRounds);
  EXPECT_EQ(stats.detached, kRounds);
  EXPECT_EQ(stats.reclaimed, 0U);
  EXPECT_EQ(stats.rejected, 0U);
  EXPECT_EQ(driver.attached_apps(), 0U);
}

TEST(SidecarAttach, AnEndpointTheDaemonDoesNotServeIsRefused) {
  const std::string name = unique_shm_name();
  DaemonConfig config = test_config(name);
  config.endpoints = {1, 4};
  DaemonDriver driver(config);
  AttachOptions stranger = test_attach(name);
  stranger.endpoint = 5;
  try {
    Client::attach(stranger);
    ADD_FAILURE() << "an app on endpoint 5 was accepted by a daemon serving endpoints 1 and 4";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("unknown_endpoint"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("endpoint 5"), std::string::npos) << e.what();
  }
  AttachOptions local = test_attach(name);
  local.endpoint = 4;
  Client accepted = Client::attach(local);
  EXPECT_TRUE(accepted.attached());
  auto hold = driver.hold();
  EXPECT_EQ(driver.daemon().stats().rejected, 1U);
  EXPECT_EQ(driver.daemon().stats().attached, 1U);
}

TEST(SidecarAttach, WithoutEndpointsEveryEndpointIsServed) {
  // The permissive mode (gradlaned without --endpoint) the other tests rely on.
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  AttachOptions any = test_attach(name);
  any.endpoint = 12345;
  EXPECT_TRUE(Client::attach(any).attached());
}

}  // namespace
}  // namespace gradlane::sidecar::test
