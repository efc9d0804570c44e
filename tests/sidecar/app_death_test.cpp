// An application dies (SIGKILL, a real process): the daemon reclaims its slot, the entries it
// had queued and the credit of what it was granted; the other apps carry on.
#include <gtest/gtest.h>

#include <chrono>

#include "harness.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

TEST(SidecarAppDeath, QueuedEntriesAndSlotAreReclaimed) {
  const std::string name = unique_shm_name();
  DaemonConfig config = test_config(name);
  config.max_apps = 2;
  DaemonDriver driver(config);
  Client survivor = Client::attach(test_attach(name, 2));
  driver.pause();  // from here the test steps the daemon by hand

  constexpr int kQueued = 10;
  Child child("app-queue", {"--shm=" + name, "--entries=" + std::to_string(kQueued)});
  // Step only until the child is attached: its requests must stay queued, unread.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (driver.attached_apps() < 2) {
    driver.step();
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the child never attached";
  }
  child.go();
  ASSERT_TRUE(child.ready(5s)) << "the child did not queue its requests";
  child.kill_now();

  driver.step_far_ahead();  // past the liveness interval: the sweep runs
  const DaemonStats& stats = driver.daemon().stats();
  EXPECT_EQ(stats.reclaimed, 1U);
  EXPECT_EQ(stats.reclaimed_entries, static_cast<std::uint64_t>(kQueued));
  EXPECT_EQ(stats.submitted, 0U) << "a dead app's queued requests must not be scheduled";
  EXPECT_EQ(driver.attached_apps(), 1U);

  // The survivor is unaffected, and the dead app's slot can be taken again.
  const std::uint64_t id = survivor.request(small_update());
  driver.step();
  const auto g = survivor.poll();
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->kind, GrantKind::go);
  EXPECT_EQ(g->request, id);

  DaemonDriver* d = &driver;
  std::atomic<bool> attached{false};
  std::thread stepper([&] {
    while (!attached.load()) d->step();
  });
  Client newcomer = Client::attach(test_attach(name, 3));
  attached.store(true);
  stepper.join();
  EXPECT_TRUE(newcomer.attached());
}

TEST(SidecarAppDeath, GrantedButUncompletedTransfersAreFailedBack) {
  const std::string name = unique_shm_name();
  sched::SchedulerConfig sc;
  sc.replica_bound = std::nullopt;
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(sc));
  Client survivor = Client::attach(test_attach(name, 2));

  Child child("app-granted", {"--shm=" + name});
  ASSERT_TRUE(child.ready(5s)) << "the child was not granted its transfer";
  auto hold = driver.hold();
  auto& scheduler = dynamic_cast<sched::SchedulerPolicy&>(driver.daemon().policy()).scheduler();
  EXPECT_GT(scheduler.in_flight(sched::EndpointId{3}), 0U);
  child.kill_now();
  driver.step_far_ahead();
  EXPECT_EQ(driver.daemon().stats().reclaimed, 1U);
  EXPECT_EQ(scheduler.in_flight(sched::EndpointId{3}), 0U) << "the dead app's credit leaked";
  hold.unlock();

  survivor.request(small_update());
  EXPECT_EQ(survivor.wait(2s).kind, GrantKind::go);
}

TEST(SidecarAppDeath, TheServerAppIsToldToSkipTheDeadSendersSequence) {
  // The server of receiver 9 is an app attached as endpoint 9 with its slots. A worker dies
  // between its grant and its write: the server must hear "cancel seq 1" rather than wait for
  // it. Not a worker of the job attached from the same NIC before it: the cancel goes to the
  // receiver's server app, not to the first app of the job on that endpoint.
  const std::string name = unique_shm_name();
  sched::SchedulerConfig sc;
  sc.replica_bound = std::nullopt;
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(sc));
  AttachOptions beside = test_attach(name, 1);
  beside.endpoint = 9;
  Client neighbour = Client::attach(beside);
  AttachOptions as_server = beside;
  as_server.slots = 8;  // receiver 9's server: cancels go to it
  Client server = Client::attach(as_server);

  Child child("app-granted", {"--shm=" + name});
  ASSERT_TRUE(child.ready(5s)) << "the child was not granted its transfer";
  kill_granted_sender(driver, child);
  const Grant cancel = server.wait(2s);
  EXPECT_EQ(cancel.kind, GrantKind::cancel);
  EXPECT_EQ(cancel.sequence, 1U);
  EXPECT_EQ(cancel.target, 9U);
  EXPECT_FALSE(neighbour.poll().has_value()) << "the worker beside the server was told the cancel";
  EXPECT_EQ(driver.stats().cancelled, 1U);
}

// B = 1, a server app on receiver 9 and a worker: seq 1 granted and completed, the request for
// seq 2 held back by the window until the server app reports seq 1 applied.
class ReplicaWindow : public ::testing::Test {
 protected:
  static sched::SchedulerConfig bound_one() {
    sched::SchedulerConfig sc;
    sc.replica_bound = 1;
    return sc;
  }
  static AttachOptions as_server(const std::string& name) {
    AttachOptions o = test_attach(name, 1);
    o.endpoint = 9;
    o.slots = 8;  // its receiver's server: only it reports what was applied
    return o;
  }
  void SetUp() override {
    const auto first = worker.request(small_update(1));
    const Grant g1 = worker.wait(2s);
    ASSERT_EQ(g1.kind, GrantKind::go);
    EXPECT_EQ(g1.sequence, 1U);
    worker.complete(first, 0, std::chrono::microseconds(10));
    worker.request(small_update(2));
    EXPECT_THROW(worker.wait(300ms), Error) << "granted beyond the replica window";
  }

  const std::string name = unique_shm_name();
  DaemonDriver driver{test_config(name), std::make_unique<sched::SchedulerPolicy>(bound_one())};
  Client server = Client::attach(as_server(name));
  Client worker = Client::attach(test_attach(name, 1));
};

TEST_F(ReplicaWindow, AppliedAcksOpenIt) {
  // An ack for a sequence never granted, or from an app that is not the receiver, is refused and
  // changes nothing.
  worker.applied(1);  // not the receiver's app
  EXPECT_EQ(worker.wait(2s).kind, GrantKind::error);
  server.applied(5);  // never granted
  EXPECT_EQ(server.wait(2s).kind, GrantKind::error);
  server.applied(1);
  const Grant g2 = worker.wait(2s);
  EXPECT_EQ(g2.kind, GrantKind::go);
  EXPECT_EQ(g2.sequence, 2U);
  EXPECT_EQ(driver.stats().acknowledged, 1U);
}

TEST_F(ReplicaWindow, AServerAppsLastAppliedBeforeDetachingStillCounts) {
  // The server app queues `applied(1)` and detaches before the daemon reads it: the ack must
  // still open the window (not be handed to complete() and refused as a bad completion).
  {
    const auto held = driver.hold();  // the daemon reads nothing until the server has left
    server.applied(1);
    server.detach();
  }
  const Grant g2 = worker.wait(2s);
  EXPECT_EQ(g2.kind, GrantKind::go) << "the detached server's last ack was lost";
  EXPECT_EQ(g2.sequence, 2U);
  EXPECT_EQ(driver.stats().acknowledged, 1U);
}

}  // namespace
}  // namespace gradlane::sidecar::test
