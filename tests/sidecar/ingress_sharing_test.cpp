// The scheduler's ingress sharing, through the daemon: what gradlaned --ingress-sharing sets
// reaches the slots the apps are granted.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "harness.hpp"
#include "sidecar/core/policy.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

// Two senders at a quarter of server 9's rate ask at once; both are decided in one step.
std::pair<Grant, Grant> two_grants(sched::IngressSharing ingress) {
  const std::string name = unique_shm_name();
  sched::SchedulerConfig sc = no_replica();
  sc.ingress = ingress;
  sc.grant_horizon = 10ms;  // both granted in the one decision, whatever the sharing
  sc.bandwidth.declared = {{sched::EndpointId{1}, sched::Direction::egress, 1.25e9},
                           {sched::EndpointId{2}, sched::Direction::egress, 1.25e9},
                           {sched::EndpointId{9}, sched::Direction::ingress, 5e9}};
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(sc));
  AttachOptions options = test_attach(name);
  Client first = Client::attach(options);
  options.endpoint = 2;
  Client second = Client::attach(options);
  Update u = small_update();
  u.bytes = 1 << 20;
  {
    auto hold = driver.hold();
    first.request(u);
    second.request(u);
    driver.step();
  }
  return {first.wait(2s), second.wait(2s)};
}

TEST(IngressSharing, PackedGrantsToQuarterRateSendersRunSideBySideExclusiveOnesOneAfterTheOther) {
  const auto [a, b] = two_grants(sched::IngressSharing::packed);
  ASSERT_EQ(a.kind, GrantKind::go);
  ASSERT_EQ(b.kind, GrantKind::go);
  EXPECT_EQ(a.slot_start, b.slot_start);
  EXPECT_EQ(a.slot_length, b.slot_length);
  EXPECT_GT(a.slot_length, 800us) << "1 MiB at 1.25 GB/s: its sender's rate, not the server's";

  const auto [c, d] = two_grants(sched::IngressSharing::exclusive);
  ASSERT_EQ(c.kind, GrantKind::go);
  ASSERT_EQ(d.kind, GrantKind::go);
  const Grant& earlier = c.slot_start < d.slot_start ? c : d;
  const Grant& later = c.slot_start < d.slot_start ? d : c;
  EXPECT_GE(later.slot_start, earlier.slot_start + earlier.slot_length);
}

}  // namespace
}  // namespace gradlane::sidecar::test
