// The credit bound (ByteScheduler/P3): bytes a NIC has granted and not completed.
#include <gtest/gtest.h>

#include "sched_test_util.hpp"
#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched {
namespace {

using namespace testing;

constexpr std::uint32_t kServer = 100;

SchedulerConfig with_credit(Bytes credit) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  c.credit_bytes = credit;
  return c;
}

TEST(SchedulerCredit, BytesInFlightNeverExceedTheCredit) {
  Scheduler s(with_credit(8 * kMiB));
  for (std::uint64_t i = 1; i <= 3; ++i) {
    ASSERT_EQ(s.submit(request(i, 1, kServer, 4 * kMiB), at_us(0)), SubmitStatus::accepted);
  }
  const auto first = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(s.in_flight(ep(1)), 8 * kMiB);
  EXPECT_EQ(s.pending_parts(), 1u);
  EXPECT_FALSE(s.next_wakeup().has_value());  // held by credit: waits for complete()
  EXPECT_TRUE(s.schedule(at_us(100)).empty());

  ASSERT_TRUE(s.complete(first[0].transfer, at_us(420), us(420)));
  EXPECT_EQ(s.in_flight(ep(1)), 4 * kMiB);
  const auto second = only<Grant>(s.schedule(at_us(420)));
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].request, RequestId{3});
  EXPECT_EQ(s.in_flight(ep(1)), 8 * kMiB);
}

TEST(SchedulerCredit, APartLargerThanTheCreditStillGoesAlone) {
  Scheduler s(with_credit(kMiB));
  ASSERT_EQ(s.submit(request(1, 1, kServer, 4 * kMiB), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(2, 1, kServer, 4 * kMiB), at_us(0)), SubmitStatus::accepted);
  const auto first = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(s.in_flight(ep(1)), 4 * kMiB);
  ASSERT_TRUE(s.complete(first[0].transfer, at_us(500), us(420)));
  EXPECT_EQ(granted_ids(s.schedule(at_us(500))), (std::vector<std::uint64_t>{2}));
}

TEST(SchedulerCredit, CreditIsPerNic) {
  Scheduler s(with_credit(kMB));
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(2, 1, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  ASSERT_EQ(s.submit(request(3, 2, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  EXPECT_EQ(granted_ids(s.schedule(at_us(0))), (std::vector<std::uint64_t>{1, 3}));
}

TEST(SchedulerCredit, AFailedTransferReturnsItsCreditButTeachesNothing) {
  Scheduler s(with_credit(kMB));
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  const auto g = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(g.size(), 1u);
  const auto generation = s.bandwidth().generation();
  EXPECT_TRUE(s.complete(g[0].transfer, at_us(5000), us(5000), TransferResult::failed));
  EXPECT_EQ(s.in_flight(ep(1)), 0u);
  EXPECT_EQ(s.bandwidth().generation(), generation);
  EXPECT_EQ(s.server_version(ep(kServer)), 1u);  // the sequence number stays consumed
  EXPECT_FALSE(s.complete(TransferId{999}, at_us(5000), us(1)));
}

TEST(SchedulerCredit, AnEarlyCompletionGivesTheRestOfTheSlotBack) {
  Scheduler s(with_credit(Bytes{1} << 40));
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  const auto g = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].slot, (Slot{at_us(0), at_us(100)}));
  ASSERT_TRUE(s.complete(g[0].transfer, at_us(60), us(60)));
  EXPECT_EQ(s.ingress(ep(kServer))->tail(), at_us(60));
  ASSERT_EQ(s.submit(request(2, 2, kServer, kMB), at_us(60)), SubmitStatus::accepted);
  const auto next = only<Grant>(s.schedule(at_us(60)));
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].slot.start, at_us(60));
}

}  // namespace
}  // namespace gradlane::sched
