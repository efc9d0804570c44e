// A receiver's server app: the app that declares its slots (or takes its sequence over) speaks
// for the receiver (its cancels: SidecarAppDeath.TheServerAppIsToldToSkipTheDeadSendersSequence). Apps of any job may
// attach from the same endpoint to send (jobs share a host's NIC), but only the server app reports what was applied and
// is told cancels, and no app of another job attaches as that receiver's server while it is there.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kReceiver = 9;  // small_update()'s receiver

AttachOptions on_receiver(const std::string& name, std::uint32_t job, std::uint32_t slots) {
  AttachOptions o = test_attach(name, job);
  o.endpoint = kReceiver;
  o.slots = slots;
  return o;
}

// The refusal an attach ends with, or "attached".
std::string attach_outcome(const AttachOptions& o) {
  try {
    Client client = Client::attach(o);
    return "attached";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(ReceiverServer, AnotherJobCanNeitherBecomeItsServerNorFreeItsSlotsNorNarrowItsWindow) {
  const std::string name = unique_shm_name();
  DaemonConfig config = test_config(name);
  config.standby = {{kReceiver, 2}};  // so job 2's takeover is refused for the job served, not the standby
  DaemonDriver driver(config, std::make_unique<sched::SchedulerPolicy>(no_replica()));
  Client server = Client::attach(on_receiver(name, 1, 2));

  // Job 2 as receiver 9's server: with slots (it would narrow job 1's window to 1), and taking
  // the sequence over.
  const std::string refusal = attach_outcome(on_receiver(name, 2, 1));
  EXPECT_NE(refusal.find("receiver_of_another_job"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("endpoint 9's server is an app of another job"), std::string::npos) << refusal;
  AttachOptions takeover = on_receiver(name, 2, 4);
  takeover.take_over_at = 100;
  EXPECT_NE(attach_outcome(takeover).find("receiver_of_another_job"), std::string::npos);

  // Sending from the server's NIC is fine for any job; reporting its progress is not, neither
  // for another job's app nor for a worker of the server's own job beside it.
  Client stranger = Client::attach(on_receiver(name, 2, 0));
  Client neighbour = Client::attach(on_receiver(name, 1, 0));
  Client worker = Client::attach(test_attach(name, 1));
  for (int i = 0; i < 4; ++i) worker.request(small_update());
  // The window is still the server's 2 slots, not the stranger's 1.
  EXPECT_EQ(take_and_complete(worker, 2), (std::vector<std::uint64_t>{1, 2}));
  for (Client* rogue : {&stranger, &neighbour}) {
    rogue->applied(2);
    const Grant refused = rogue->wait(2s);
    EXPECT_EQ(refused.kind, GrantKind::error);
    EXPECT_EQ(refused.reason, Reason::bad_receiver);
  }
  EXPECT_THROW(worker.wait(300ms), Error) << "an app other than the server freed its slots";
  EXPECT_EQ(driver.stats().acknowledged, 0U);

  server.applied(2);
  EXPECT_EQ(take_and_complete(worker, 2), (std::vector<std::uint64_t>{3, 4}));
  EXPECT_EQ(driver.stats().acknowledged, 1U);

  // Once the server has left, the receiver is free: another job may serve it.
  server.detach();
  EXPECT_EQ(attach_outcome(on_receiver(name, 2, 2)), "attached");
}

// A server that died (or is restarting) leaves its job's receiver: until it or its replica is
// back, no app of another job may serve it (narrow its window, replace its grant key, take its
// sequence) nor ask it for slots. A clean detach gives it up (the test above).
TEST(ReceiverServer, WhileItsServerIsGoneWithoutDetachingTheReceiverStaysItsJobs) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(no_replica()));
  Child server("app-serves", {"--shm=" + name});
  ASSERT_TRUE(server.ready(5s));
  Client stranger = Client::attach(test_attach(name, 2));
  server.kill_now();
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (driver.stats().reclaimed == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the daemon never found its server dead";
    std::this_thread::sleep_for(1ms);
  }
  const std::string refusal = attach_outcome(on_receiver(name, 2, 1));
  EXPECT_NE(refusal.find("receiver_of_another_job"), std::string::npos) << "job 2 served job 1's receiver: " << refusal;
  stranger.request(small_update());
  const Grant refused = stranger.wait(2s);
  EXPECT_EQ(refused.kind, GrantKind::error);
  EXPECT_EQ(refused.reason, Reason::receiver_of_another_job);
  EXPECT_EQ(attach_outcome(on_receiver(name, 1, 2)), "attached") << "its own job's server, restarted";
}

// A standby host takes a server's sequence over only for the job named with --standby: an
// app of another job that attaches with take_over_at (no server attached here to refuse it
// for) is refused, and the job's own replica takes it over.
TEST(ReceiverServer, AtAStandbyHostOnlyTheNamedJobTakesTheSequenceOver) {
  const std::string name = unique_shm_name();
  DaemonConfig config = test_config(name);
  config.standby = {{kReceiver, 1}};
  DaemonDriver driver(config, std::make_unique<sched::SchedulerPolicy>(no_replica()));
  AttachOptions stranger = on_receiver(name, 2, 4);
  stranger.take_over_at = 100;
  const std::string refusal = attach_outcome(stranger);
  EXPECT_NE(refusal.find("bad_takeover"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("--standby 9:2"), std::string::npos) << "the hint names what is missing: " << refusal;
  EXPECT_EQ(driver.stats().takeovers, 0U);

  AttachOptions replica = on_receiver(name, 1, 4);
  replica.take_over_at = 100;
  Client promoted = Client::attach(replica);
  EXPECT_EQ(driver.stats().takeovers, 1U);
  Client worker = Client::attach(test_attach(name, 1));
  Update fresh = small_update();
  fresh.computed_on = 100;  // on the promoted replica's model
  worker.request(fresh);
  EXPECT_EQ(take_and_complete(worker, 1), (std::vector<std::uint64_t>{101})) << "the sequence goes on after 100";
}

TEST(ReceiverServer, AnotherJobsRequestForItIsRefusedAndTakesNoSequenceNumber) {
  // Each sequence number is a slot the server waits for; job 2 cannot write there (no QP without
  // job 1's key), so its grant would be a hole. Refused while job 1's server is attached.
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(no_replica()));
  auto server = std::make_optional(Client::attach(on_receiver(name, 1, 8)));
  Client stranger = Client::attach(test_attach(name, 2));
  Client worker = Client::attach(test_attach(name, 1));
  stranger.request(small_update());
  const Grant refused = stranger.wait(2s);
  EXPECT_EQ(refused.kind, GrantKind::error);
  EXPECT_EQ(refused.reason, Reason::receiver_of_another_job);
  worker.request(small_update());
  EXPECT_EQ(take_and_complete(worker, 1), (std::vector<std::uint64_t>{1})) << "job 2's request took a sequence";
  server.reset();  // detaches: receiver 9 serves any job again, once the daemon has seen it
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (driver.attached_apps() > 2) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the daemon never saw the server detach";
    std::this_thread::sleep_for(1ms);
  }
  stranger.request(small_update());
  EXPECT_EQ(take_and_complete(stranger, 1), (std::vector<std::uint64_t>{2}));
}

TEST(ReceiverServer, AServerOfTheSameJobTakesTheReceiverOverFromItsPredecessor) {
  // A server restarted in place may attach before its dead predecessor is swept: the newest
  // speaks for the receiver, and the predecessor no longer does.
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(no_replica()));
  Client old_server = Client::attach(on_receiver(name, 1, 2));
  Client new_server = Client::attach(on_receiver(name, 1, 2));
  Client worker = Client::attach(test_attach(name, 1));
  for (int i = 0; i < 3; ++i) worker.request(small_update());
  take_and_complete(worker, 2);
  old_server.applied(2);
  EXPECT_EQ(old_server.wait(2s).reason, Reason::bad_receiver);
  new_server.applied(2);
  EXPECT_EQ(worker.wait(2s).sequence, 3U);
  old_server.detach();  // leaving does not take the receiver from its successor
  new_server.applied(3);
  EXPECT_THROW(new_server.wait(300ms), Error) << "the successor's ack was refused";
  EXPECT_EQ(driver.stats().acknowledged, 2U);
}

}  // namespace
}  // namespace gradlane::sidecar::test
