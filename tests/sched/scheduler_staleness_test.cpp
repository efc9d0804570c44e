// The staleness bound tau: respected by every grant, and drops exactly when an update could
// no longer make it — never before, never after it crossed the network.
#include <gtest/gtest.h>

#include "sched_test_util.hpp"
#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched {
namespace {

using namespace testing;

constexpr std::uint32_t kServer = 100;

SchedulerConfig with_tau(std::optional<std::uint32_t> tau) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  c.staleness_bound = tau;
  return c;
}

TEST(SchedulerStaleness, GrantsUpToTauThenDrops) {
  Scheduler s(with_tau(2));
  for (std::uint32_t w = 1; w <= 5; ++w) {
    ASSERT_EQ(s.submit(request(w, w, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  }
  const auto out = s.schedule(at_us(0));
  ASSERT_EQ(out.size(), 5u);
  const auto grants = only<Grant>(out);
  ASSERT_EQ(grants.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(grants[i].request, RequestId{i + 1});
    EXPECT_EQ(grants[i].seq, i + 1);
    EXPECT_EQ(grants[i].delay, i);  // applied to versions 0, 1, 2; computed on 0
  }
  const auto drops = only<Drop>(out);
  ASSERT_EQ(drops.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(drops[i].request, RequestId{i + 4});
    EXPECT_EQ(drops[i].reason, DropReason::staleness_bound);
    EXPECT_EQ(drops[i].delay, 3u);  // would have been applied to version 3
    EXPECT_EQ(drops[i].sender, ep(static_cast<std::uint32_t>(i + 4)));
  }
  // Dropped updates never touched the network: no slot, no credit, no sequence number.
  EXPECT_EQ(s.in_flight(ep(4)), 0u);
  EXPECT_EQ(s.server_version(ep(kServer)), 3u);
  EXPECT_EQ(s.ingress(ep(kServer))->slots().size(), 3u);
  EXPECT_EQ(s.stats().drops, 2u);
}

TEST(SchedulerStaleness, DropsExactlyWhenTheNextVersionIsTooLate) {
  Scheduler s(with_tau(2));
  ASSERT_TRUE(s.open_receiver(ep(kServer), 5));
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMB, 2), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(2, 2, kServer, kMB, 3), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(3, 3, kServer, kMB, 5), at_us(0)), SubmitStatus::accepted);
  const auto out = s.schedule(at_us(0));
  ASSERT_EQ(out.size(), 3u);
  // Request 1 (computed on 2) is already 3 behind version 5: hopeless even if sent first.
  const Drop* d = std::get_if<Drop>(&out[0]);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->request, RequestId{1});
  EXPECT_EQ(d->delay, 3u);
  // Request 2 (computed on 3) makes it with delay exactly tau = 2.
  const Grant* g2 = std::get_if<Grant>(&out[1]);
  ASSERT_NE(g2, nullptr);
  EXPECT_EQ(g2->request, RequestId{2});
  EXPECT_EQ(g2->seq, 6u);
  EXPECT_EQ(g2->delay, 2u);
  const Grant* g3 = std::get_if<Grant>(&out[2]);
  ASSERT_NE(g3, nullptr);
  EXPECT_EQ(g3->request, RequestId{3});
  EXPECT_EQ(g3->seq, 7u);
  EXPECT_EQ(g3->delay, 1u);
}

TEST(SchedulerStaleness, AnUnboundedTauNeverDrops) {
  Scheduler s(with_tau(std::nullopt));
  for (std::uint32_t w = 1; w <= 50; ++w) {
    ASSERT_EQ(s.submit(request(w, w, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  }
  const auto out = s.schedule(at_us(0));
  EXPECT_EQ(only<Grant>(out).size(), 50u);
  EXPECT_EQ(only<Grant>(out).back().delay, 49u);
}

TEST(SchedulerStaleness, TauZeroMeansOnlyFreshUpdatesAreApplied) {
  Scheduler s(with_tau(0));
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(2, 2, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  auto out = s.schedule(at_us(0));
  EXPECT_EQ(granted_ids(out), (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(only<Drop>(out).size(), 1u);
  // A worker that pulled version 1 is fresh again.
  ASSERT_EQ(s.submit(request(3, 2, kServer, kMB, 1), at_us(0)), SubmitStatus::accepted);
  out = s.schedule(at_us(0));
  ASSERT_EQ(only<Grant>(out).size(), 1u);
  EXPECT_EQ(only<Grant>(out)[0].delay, 0u);
}

// A request's own earlier parts do not count against it (staleness.hpp): a 3-part tensor
// computed on the current model meets tau = 1 behind one other update.
TEST(SchedulerStaleness, OwnPartsDoNotCountAsStaleness) {
  Scheduler s(with_tau(1));
  ASSERT_EQ(s.submit(request(1, 1, kServer, 10 * kMiB), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(2, 2, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  const auto grants = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(grants.size(), 4u);
  EXPECT_EQ(grants[0].request, RequestId{2});  // 100 us beats a 350 us part
  EXPECT_EQ(grants[0].delay, 0u);
  for (std::size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(grants[i].request, RequestId{1});
    EXPECT_EQ(grants[i].part, i - 1);
    EXPECT_EQ(grants[i].seq, i + 1);
    EXPECT_EQ(grants[i].delay, 1u);  // applied to 1, 2, 3; minus 0, 1, 2 own parts
  }
}

TEST(SchedulerStaleness, AHopelessPartDropsTheRestOfItsRequestAtOnce) {
  Scheduler s(with_tau(0));
  ASSERT_EQ(s.submit(request(1, 1, kServer, 10 * kMiB), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(2, 2, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  const auto out = s.schedule(at_us(0));
  EXPECT_EQ(granted_ids(out), (std::vector<std::uint64_t>{2}));
  const auto drops = only<Drop>(out);
  ASSERT_EQ(drops.size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(drops[i].request, RequestId{1});
    EXPECT_EQ(drops[i].part, i);
    EXPECT_EQ(drops[i].part_count, 3u);
    EXPECT_EQ(drops[i].delay, 1u);
  }
  EXPECT_EQ(s.pending_parts(), 0u);
}

// A sender held back by its credit still gets its drop as soon as its head is hopeless.
TEST(SchedulerStaleness, HopelessUpdatesAreDroppedEvenWhileBlockedByCredit) {
  SchedulerConfig c = with_tau(1);
  c.credit_bytes = kMB;
  Scheduler s(c);
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(2, 1, kServer, kMB), at_us(0)), SubmitStatus::accepted);  // blocked
  ASSERT_EQ(s.submit(request(3, 2, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(4, 3, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  const auto out = s.schedule(at_us(0));
  EXPECT_EQ(granted_ids(out), (std::vector<std::uint64_t>{1, 3}));
  const auto drops = only<Drop>(out);
  ASSERT_EQ(drops.size(), 2u);
  EXPECT_EQ(drops[0].request, RequestId{2});
  EXPECT_EQ(drops[1].request, RequestId{4});
}

}  // namespace
}  // namespace gradlane::sched
