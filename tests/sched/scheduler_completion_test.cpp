// What complete() gives back of a slot: the rest of it when the transfer is known finished
// early, nothing when it failed (its bytes may still be arriving, e.g. from a sender whose
// sidecar was lost), so a later grant is never booked on top of a transfer still running.
#include <gtest/gtest.h>

#include "sched_test_util.hpp"
#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched {
namespace {

using namespace testing;

constexpr std::uint32_t kServer = 100;

SchedulerConfig one_gbps() {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(1 * kGBps, 0.25, 1e6);  // 1 MB takes 1000 us
  return c;
}

// Grants one 1 MB transfer from worker 1 at t=0, completes it at 400 us with `result`, then
// grants one from worker 2 and returns both grants.
std::pair<Grant, Grant> early_completion_then_next(TransferResult result) {
  Scheduler s(one_gbps());
  EXPECT_EQ(s.submit(request(1, 1, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  const auto first = only<Grant>(s.schedule(at_us(0)));
  EXPECT_EQ(first.size(), 1u);
  EXPECT_TRUE(s.complete(first.at(0).transfer, at_us(400), us(400), result));
  EXPECT_EQ(s.submit(request(2, 2, kServer, kMB), at_us(400)), SubmitStatus::accepted);
  const auto second = only<Grant>(s.schedule(at_us(400)));
  EXPECT_EQ(second.size(), 1u);
  return {first.at(0), second.at(0)};
}

TEST(SchedulerCompletion, AnEarlyCompletionGivesTheRestOfTheSlotBack) {
  const auto [first, second] = early_completion_then_next(TransferResult::ok);
  ASSERT_EQ(first.slot.end, at_us(1000));
  EXPECT_EQ(second.slot.start, at_us(400)) << "the idle rest of a finished transfer's slot is granted again";
  EXPECT_EQ(used_slot(first.slot, at_us(400), TransferResult::ok).end, at_us(400));
}

TEST(SchedulerCompletion, AFailedTransferKeepsItsWholeSlot) {
  const auto [first, second] = early_completion_then_next(TransferResult::failed);
  EXPECT_GE(second.slot.start, first.slot.end) << "granted on top of a transfer that may still be running";
  EXPECT_EQ(used_slot(first.slot, at_us(400), TransferResult::failed), first.slot);
}

TEST(SchedulerCompletion, UsedSlotNeverLeavesThePlannedSlot) {
  const Slot planned{at_us(100), at_us(200)};
  EXPECT_EQ(used_slot(planned, at_us(50), TransferResult::ok), (Slot{at_us(100), at_us(100)}));
  EXPECT_EQ(used_slot(planned, at_us(150), TransferResult::ok), (Slot{at_us(100), at_us(150)}));
  EXPECT_EQ(used_slot(planned, at_us(300), TransferResult::ok), planned);
}

TEST(SchedulerCompletion, TransferShowsWhatWasGrantedUntilItCompletes) {
  Scheduler s(one_gbps());
  ASSERT_EQ(s.submit(request(1, 1, kServer, kMB), at_us(0)), SubmitStatus::accepted);
  const auto g = only<Grant>(s.schedule(at_us(0))).at(0);
  const auto view = s.transfer(g.transfer);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->sender, ep(1));
  EXPECT_EQ(view->receiver, ep(kServer));
  EXPECT_EQ(view->slot, g.slot);
  EXPECT_EQ(view->seq, g.seq);
  EXPECT_EQ(view->bytes, kMB);
  ASSERT_TRUE(s.complete(g.transfer, at_us(900), us(900)));
  EXPECT_FALSE(s.transfer(g.transfer).has_value());
}

}  // namespace
}  // namespace gradlane::sched
