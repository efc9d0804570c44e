// The replication hook: sequence numbers never more than B ahead of the replica's ack.
#include <gtest/gtest.h>

#include "sched_test_util.hpp"
#include "sidecar/core/replication_window.hpp"
#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched {
namespace {

using namespace testing;

constexpr std::uint32_t kServer = 100;

TEST(ReplicationWindow, GrantsUpToBAheadOfTheAck) {
  ReplicationWindow w(2);
  EXPECT_EQ(w.grant(), 1u);
  EXPECT_EQ(w.grant(), 2u);
  EXPECT_FALSE(w.can_grant());
  EXPECT_EQ(w.lag(), 2u);
  EXPECT_TRUE(w.ack(1));
  EXPECT_TRUE(w.can_grant());
  EXPECT_EQ(w.grant(), 3u);
  EXPECT_FALSE(w.can_grant());
  EXPECT_TRUE(w.ack(0));  // stale: harmless
  EXPECT_EQ(w.acked(), 1u);
  EXPECT_FALSE(w.ack(4));  // never granted: rejected
  EXPECT_EQ(w.acked(), 1u);
}

TEST(ReplicationWindow, UnreplicatedNeverBlocks) {
  ReplicationWindow w;
  for (int i = 0; i < 1000; ++i) w.grant();
  EXPECT_TRUE(w.can_grant());
}

TEST(ReplicationWindow, StartsAtTheGivenVersion) {
  ReplicationWindow w(1, 41);
  EXPECT_EQ(w.next(), 42u);
  EXPECT_EQ(w.grant(), 42u);
  EXPECT_FALSE(w.can_grant());
}

TEST(SchedulerReplication, TheServerWaitsForTheReplicaAtB) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  c.replica_bound = 2;
  c.staleness_bound = 8;
  Scheduler s(c);
  for (std::uint32_t w = 1; w <= 5; ++w) {
    ASSERT_EQ(s.submit(request(w, w, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  }
  auto grants = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(grants.size(), 2u);
  EXPECT_EQ(grants[1].seq, 2u);
  EXPECT_TRUE(s.schedule(at_us(10)).empty());  // blocked, nothing dropped
  EXPECT_EQ(s.pending_parts(), 3u);

  EXPECT_FALSE(s.replica_ack(ep(kServer), 3));  // never granted
  EXPECT_FALSE(s.replica_ack(ep(555), 1));      // unknown server
  EXPECT_TRUE(s.replica_ack(ep(kServer), 1));
  grants = only<Grant>(s.schedule(at_us(150)));
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].seq, 3u);
  EXPECT_EQ(grants[0].slot.start, at_us(200));

  EXPECT_TRUE(s.replica_ack(ep(kServer), 3));
  grants = only<Grant>(s.schedule(at_us(250)));
  ASSERT_EQ(grants.size(), 2u);
  EXPECT_EQ(grants[1].seq, 5u);
  EXPECT_EQ(s.replica_acked(ep(kServer)), 3u);
  EXPECT_EQ(s.stats().drops, 0u);
}

TEST(SchedulerReplication, AReplicaTakingOverContinuesTheSequence) {
  SchedulerConfig c = plain_config();
  c.replica_bound = 4;
  Scheduler s(c);
  ASSERT_TRUE(s.open_receiver(ep(kServer), 40));
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMB, 40), at_us(0)), SubmitStatus::accepted);
  const auto grants = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].seq, 41u);
  EXPECT_EQ(grants[0].delay, 0u);
  EXPECT_FALSE(s.open_receiver(ep(kServer), 7));  // too late: sequence numbers were granted
}

TEST(SchedulerReplication, ClosingAReceiverDropsItsPendingPartsAndLetsItRestartElsewhere) {
  // The server died and its replica was promoted at version 10: what waited for the old server
  // is dropped (receiver_moved), a grant of the old server that fails cancels nothing (its
  // sequence is the old server's), and the sequence restarts after the promoted version.
  SchedulerConfig c = plain_config();
  c.replica_bound = 2;
  Scheduler s(c);
  for (std::uint32_t w = 1; w <= 4; ++w) {
    ASSERT_EQ(s.submit(request(w, w, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  }
  ASSERT_EQ(s.submit(request(9, 5, 200, kMB), at_us(0)), SubmitStatus::accepted);  // another server's
  const auto out = s.schedule(at_us(0));
  const auto granted = only<Grant>(out);
  ASSERT_EQ(granted.size(), 3u) << "two for the server (B = 2), one for the other";
  ASSERT_EQ(s.pending_parts(), 2u);

  std::vector<Outcome> moved;
  EXPECT_EQ(s.close_receiver(ep(kServer), moved), 0u);
  const auto drops = only<Drop>(moved);
  ASSERT_EQ(drops.size(), 2u);
  ASSERT_EQ(moved.size(), 2u) << "only drops";
  for (const Drop& d : drops) {
    EXPECT_EQ(d.reason, DropReason::receiver_moved);
    EXPECT_EQ(d.receiver, ep(kServer));
  }
  EXPECT_EQ(s.pending_parts(), 0u);
  for (const Grant& g : granted) {
    if (g.receiver == ep(kServer)) {
      EXPECT_TRUE(s.complete(g.transfer, at_us(5), us(5), TransferResult::failed));
    }
  }
  EXPECT_TRUE(only<Cancel>(s.schedule(at_us(10))).empty()) << "an old server's sequence is not cancelled at the new";

  ASSERT_TRUE(s.open_receiver(ep(kServer), 10));
  ASSERT_EQ(s.submit(request(20, 1, kServer, kMB, 10), at_us(20)), SubmitStatus::accepted);
  const auto again = only<Grant>(s.schedule(at_us(20)));
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].seq, 11u);
  EXPECT_EQ(s.server_version(ep(kServer)), 11u);
  EXPECT_EQ(s.server_version(ep(200)), 1u) << "the other server is untouched";
}

// No replica, so no B: the server's own slot count still bounds how far its sequence runs
// ahead of what it applied (a 4 mbit/s server ingress let grants run 8+ ahead and two writes
// landed in slots still holding unapplied updates). Narrowing only; kept across a takeover.
TEST(SchedulerReplication, AServersSlotsBoundItsSequenceWithoutAReplica) {
  SchedulerConfig c = plain_config();  // replica_bound: none
  Scheduler s(c);
  s.limit_window(ep(kServer), 3);
  s.limit_window(ep(kServer), 5);  // wider: ignored
  for (std::uint32_t w = 1; w <= 6; ++w) {
    ASSERT_EQ(s.submit(request(w, w, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  }
  auto grants = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(grants.size(), 3u) << "at most its 3 slots ahead of what it applied (0)";
  EXPECT_TRUE(s.replica_ack(ep(kServer), 2));  // the server applied 1 and 2
  grants = only<Grant>(s.schedule(at_us(10'000)));
  ASSERT_EQ(grants.size(), 2u);
  EXPECT_EQ(grants[1].seq, 5u);
  EXPECT_EQ(s.stats().drops, 0u);

  std::vector<Outcome> moved;
  s.close_receiver(ep(kServer), moved);  // promoted elsewhere and back: the limit stays
  ASSERT_TRUE(s.open_receiver(ep(kServer), 20));
  for (std::uint32_t w = 1; w <= 5; ++w) {
    ASSERT_EQ(s.submit(request(100 + w, w, kServer, kMB, 20), at_us(20'000)), SubmitStatus::accepted);
  }
  EXPECT_EQ(only<Grant>(s.schedule(at_us(20'000))).size(), 3u);
}

// A sidecar restarted under a running server: it holds the server's sequence (nothing
// granted, nothing dropped, other servers untouched) until the server takes it over at the
// version it reached; the server's slots still bound the window after that.
TEST(SchedulerReplication, AHeldReceiverGrantsNothingUntilItsServerTakesItsSequenceOver) {
  SchedulerConfig c = plain_config();  // replica_bound: none
  Scheduler s(c);
  s.hold_receiver(ep(kServer));
  s.limit_window(ep(kServer), 4);  // the server's slots, as its attach says: still held
  for (std::uint32_t w = 1; w <= 6; ++w) {
    // Worker 6's model came from the surviving server, at a version this sidecar never
    // granted: held with the rest, not refused as from the future.
    ASSERT_EQ(s.submit(request(w, w, kServer, kMB, w == 6 ? 25 : 0), at_us(0)), SubmitStatus::accepted);
  }
  ASSERT_EQ(s.submit(request(9, 50, 200, kMB), at_us(0)), SubmitStatus::accepted);  // another server's
  auto out = s.schedule(at_us(0));
  auto grants = only<Grant>(out);
  ASSERT_EQ(grants.size(), 1u) << "only the other server's";
  EXPECT_EQ(grants[0].receiver, ep(200));
  EXPECT_TRUE(only<Drop>(out).empty()) << "held, not dropped";
  EXPECT_TRUE(only<Grant>(s.schedule(at_us(1'000'000))).empty()) << "still held a second later";
  EXPECT_EQ(s.pending_parts(), 6u);

  std::vector<Outcome> moved;
  s.close_receiver(ep(kServer), moved);  // what take_over does first: the waiting parts go
  EXPECT_EQ(only<Drop>(moved).size(), 6u);
  ASSERT_TRUE(s.open_receiver(ep(kServer), 30));
  for (std::uint32_t w = 1; w <= 6; ++w) {
    ASSERT_EQ(s.submit(request(100 + w, w, kServer, kMB, 30), at_us(2'000'000)), SubmitStatus::accepted);
  }
  grants = only<Grant>(s.schedule(at_us(2'000'000)));
  ASSERT_EQ(grants.size(), 4u) << "from the version it took over at, 4 slots ahead";
  EXPECT_EQ(grants[0].seq, 31u);
  EXPECT_EQ(grants[3].seq, 34u);
}

TEST(SchedulerCancel, AFailedGrantIsCancelledAtItsReceiverAndAnOkOneIsNot) {
  SchedulerConfig c = plain_config();
  c.replica_bound = std::nullopt;
  Scheduler s(c);
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMiB), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(2, 2, kServer, kMiB), at_us(0)), SubmitStatus::accepted);
  const auto grants = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(grants.size(), 2u);
  EXPECT_TRUE(s.complete(grants[0].transfer, at_us(1000), us(1000), TransferResult::ok));
  EXPECT_TRUE(s.complete(grants[1].transfer, at_us(1000), us(1000), TransferResult::failed));
  const auto out = s.schedule(at_us(2000));
  const auto cancels = only<Cancel>(out);
  ASSERT_EQ(cancels.size(), 1u) << "exactly the failed grant is cancelled";
  EXPECT_EQ(cancels[0].seq, grants[1].seq);
  EXPECT_EQ(cancels[0].receiver, EndpointId{kServer});
  EXPECT_EQ(cancels[0].transfer, grants[1].transfer);
  EXPECT_FALSE(cancels[0].sender_may_write) << "its sender said it failed";
  EXPECT_TRUE(only<Cancel>(s.schedule(at_us(3000))).empty()) << "a cancel is emitted once";
}

TEST(SchedulerCancel, AGrantWhoseSendersSidecarWasLostIsCancelledSayingItsSenderMayStillWrite) {
  SchedulerConfig c = plain_config();
  c.replica_bound = std::nullopt;
  Scheduler s(c);
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMiB), at_us(0)), SubmitStatus::accepted);
  const auto grants = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_TRUE(s.complete(grants[0].transfer, at_us(10), us(0), TransferResult::sender_lost));
  const auto cancels = only<Cancel>(s.schedule(at_us(20)));
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].seq, grants[0].seq);
  EXPECT_TRUE(cancels[0].sender_may_write);
  EXPECT_EQ(s.ingress(EndpointId{kServer})->tail(), grants[0].slot.end) << "its whole slot stays booked";
}

}  // namespace
}  // namespace gradlane::sched
