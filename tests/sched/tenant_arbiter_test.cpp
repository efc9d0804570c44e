#include "sidecar/core/tenant_arbiter.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "sched_test_util.hpp"
#include "sidecar/core/partition.hpp"

namespace gradlane::sched {
namespace {

using testing::kMB;

QueuedPart part(std::uint64_t request, Bytes length, std::uint32_t priority = 0, std::uint32_t index = 0) {
  return QueuedPart{priority, RequestId{request}, index, 1, Bytes{index} * length, length};
}

TEST(TenantArbiter, EmptyHasNoHead) {
  const TenantArbiter a(0.1, kMB);
  EXPECT_FALSE(a.head().has_value());
  EXPECT_TRUE(a.empty());
}

TEST(TenantArbiter, WithinAJobLowerPriorityValueGoesFirstThenRequestIdThenPart) {
  TenantArbiter a;
  a.push(JobId{1}, part(1, kMB, 3));
  a.push(JobId{1}, part(2, kMB, 1));
  a.push(JobId{1}, part(3, kMB, 2));
  a.push(JobId{1}, part(4, kMB, 1, 1));
  a.push(JobId{1}, part(4, kMB, 1, 0));
  std::vector<std::pair<std::uint64_t, std::uint32_t>> order;
  while (auto h = a.head()) {
    order.emplace_back(to_int(h->part.request), h->part.index);
    a.pop(h->job);
  }
  const std::vector<std::pair<std::uint64_t, std::uint32_t>> expected{{2, 0}, {4, 0}, {4, 1}, {3, 0}, {1, 0}};
  EXPECT_EQ(order, expected);
}

// A whole request is one queued run that hands out Partitioner's parts one by one: 4,096 parts
// of a 16 GiB update, each where the partitioner puts it, with a more urgent request served
// between two of them, and a drop returning exactly the parts not yet handed out.
TEST(TenantArbiter, ARequestsPartsAreQueuedAsOneRunAndHandedOutInOrder) {
  constexpr Bytes kHuge = Bytes{16} << 30;
  const Partitioner partitioner;
  const std::uint32_t count = partitioner.count(kHuge);
  ASSERT_EQ(count, 4096u);
  TenantArbiter a;
  a.push_parts(JobId{1}, QueuedRun{2, RequestId{7}, 0, count, count, 0, partitioner.part(kHuge, 0).length, kHuge});
  EXPECT_EQ(a.queued_parts(), count);
  EXPECT_EQ(a.remaining(JobId{1}), kHuge);
  for (std::uint32_t i = 0; i < 3; ++i) {
    const QueuedPart p = a.pop(JobId{1});
    const Partition want = partitioner.part(kHuge, i);
    EXPECT_EQ(p.index, i);
    EXPECT_EQ(p.count, count);
    EXPECT_EQ(p.offset, want.offset);
    EXPECT_EQ(p.length, want.length);
  }
  a.push(JobId{1}, part(8, kMB, 1));  // more urgent: goes between parts 2 and 3
  EXPECT_EQ(a.head()->part.request, RequestId{8});
  EXPECT_EQ(a.pop(JobId{1}).request, RequestId{8});
  EXPECT_EQ(a.head()->part.index, 3u);
  const std::vector<QueuedPart> rest = a.remove_request(JobId{1}, RequestId{7});
  ASSERT_EQ(rest.size(), count - 3);
  EXPECT_EQ(rest.front().index, 3u);
  EXPECT_EQ(rest.back().index, count - 1);
  EXPECT_EQ(rest.back().offset + rest.back().length, kHuge);
  EXPECT_TRUE(a.empty());
}

TEST(TenantArbiter, ShortestRemainingJobFirst) {
  TenantArbiter a;
  for (std::uint64_t i = 0; i < 10; ++i) a.push(JobId{1}, part(100 + i, kMB));  // 10 MB
  a.push(JobId{2}, part(200, kMB));
  a.push(JobId{2}, part(201, kMB));      // 2 MB
  a.push(JobId{3}, part(300, 3 * kMB));  // 3 MB
  EXPECT_EQ(a.head()->job, JobId{2});
  EXPECT_EQ(a.remaining(JobId{1}), 10 * kMB);
  a.pop(JobId{2});
  a.pop(JobId{2});
  EXPECT_EQ(a.head()->job, JobId{3});
  a.pop(JobId{3});
  EXPECT_EQ(a.head()->job, JobId{1});
}

// One update queued each: queued bytes tie. What each job declared it still has to send
// (MLNet: the job nearest its end goes first) decides, whatever the ids.
TEST(TenantArbiter, TheJobThatDeclaresLessWorkLeftGoesFirst) {
  TenantArbiter a;
  a.push(JobId{1}, part(1, kMB), 90 * kMB);
  a.push(JobId{2}, part(2, kMB), 30 * kMB);
  EXPECT_EQ(a.head()->job, JobId{2});
  EXPECT_EQ(a.remaining(JobId{2}), 30 * kMB);
  // A later declaration replaces the earlier one (the job made progress).
  a.push(JobId{1}, part(3, kMB), 20 * kMB);
  EXPECT_EQ(a.head()->job, JobId{1});
}

TEST(TenantArbiter, QueuedBytesCountWhenMoreThanDeclaredOrNothingDeclared) {
  TenantArbiter a;
  for (std::uint64_t i = 0; i < 5; ++i) a.push(JobId{1}, part(10 + i, kMB), 2 * kMB);  // declares less than it queued
  a.push(JobId{2}, part(20, 3 * kMB));                                                 // declares nothing
  EXPECT_EQ(a.remaining(JobId{1}), 5 * kMB);
  EXPECT_EQ(a.head()->job, JobId{2});
}

TEST(TenantArbiter, AJobThatGoesIdleForgetsItsDeclaration) {
  TenantArbiter a;
  a.push(JobId{1}, part(1, kMB), 90 * kMB);
  a.pop(JobId{1});
  a.push(JobId{1}, part(2, kMB));  // undeclared now: its queued megabyte
  a.push(JobId{2}, part(3, 2 * kMB));
  EXPECT_EQ(a.remaining(JobId{1}), kMB);
  EXPECT_EQ(a.head()->job, JobId{1});
}

TEST(TenantArbiter, EqualRemainingBreaksTiesByJobId) {
  TenantArbiter a;
  a.push(JobId{7}, part(1, kMB));
  a.push(JobId{3}, part(2, kMB));
  EXPECT_EQ(a.head()->job, JobId{3});
}

// Job 1 is big and always backlogged; job 2 keeps one small part queued, so SRJF alone would
// pick job 2 forever. With a 25% floor job 1 is owed 0.25 MB per MB sent and goes once it is
// owed its next 1 MB part: fifth at first (4 x 0.25), then every fourth grant (0.25 left over
// plus 3 x 0.25) — exactly a quarter of the bytes.
TEST(TenantArbiter, FloorGivesTheLargeJobItsShareExactly) {
  TenantArbiter a(0.25, kMB);
  for (std::uint64_t i = 0; i < 100; ++i) a.push(JobId{1}, part(1000 + i, kMB));
  std::uint64_t next_small = 1;
  a.push(JobId{2}, part(next_small++, kMB));
  std::string order;
  for (int i = 0; i < 17; ++i) {
    const auto h = a.head();
    ASSERT_TRUE(h.has_value());
    order += h->job == JobId{1} ? 'A' : 'B';
    const QueuedPart p = a.pop(h->job);
    a.served(h->job, p.length);
    if (a.remaining(JobId{2}) == 0) a.push(JobId{2}, part(next_small++, kMB));
  }
  EXPECT_EQ(order, "BBBBABBBABBBABBBA");
}

TEST(TenantArbiter, ZeroFloorIsPureShortestRemainingJobFirst) {
  TenantArbiter a(0.0, kMB);
  for (std::uint64_t i = 0; i < 10; ++i) a.push(JobId{1}, part(1000 + i, kMB));
  std::uint64_t next_small = 1;
  a.push(JobId{2}, part(next_small++, kMB));
  for (int i = 0; i < 50; ++i) {
    const auto h = a.head();
    ASSERT_EQ(h->job, JobId{2});
    a.served(h->job, a.pop(h->job).length);
    a.push(JobId{2}, part(next_small++, kMB));
  }
}

// The guarantee with several starved jobs and uneven part sizes: every job that stays
// backlogged gets at least floor * (bytes sent) minus two of the largest parts.
TEST(TenantArbiter, FloorHoldsForSeveralStarvedJobs) {
  const double floor = 0.2;
  const Bytes max_part = 4 * kMB;
  TenantArbiter a(floor, max_part);
  std::uint64_t id = 1;
  for (int i = 0; i < 400; ++i) {
    a.push(JobId{1}, part(id++, (1 + i % 4) * kMB));
    a.push(JobId{2}, part(id++, (1 + (i + 1) % 3) * kMB));
  }
  std::map<JobId, double> served;
  double total = 0;
  for (int i = 0; i < 600; ++i) {
    if (a.remaining(JobId{3}) == 0) a.push(JobId{3}, part(id++, kMB / 2));
    const auto h = a.head();
    const QueuedPart p = a.pop(h->job);
    a.served(h->job, p.length);
    served[h->job] += static_cast<double>(p.length);
    total += static_cast<double>(p.length);
    for (const JobId j : {JobId{1}, JobId{2}}) {
      ASSERT_GE(served[j], floor * total - 2.0 * static_cast<double>(max_part))
          << "job " << to_int(j) << " after " << i + 1 << " grants";
    }
  }
  EXPECT_GT(served[JobId{3}], 0.5 * total);  // SRJF still gives the small job the rest
}

TEST(TenantArbiter, AnIdleJobForgetsWhatItWasOwed) {
  TenantArbiter a(0.5, kMB);
  a.push(JobId{1}, part(1, 10 * kMB));
  a.push(JobId{2}, part(2, kMB));
  a.served(JobId{2}, kMB);
  EXPECT_DOUBLE_EQ(a.owed(JobId{1}), 0.5 * static_cast<double>(kMB));
  a.pop(JobId{1});  // job 1 goes idle
  EXPECT_DOUBLE_EQ(a.owed(JobId{1}), 0.0);
  a.push(JobId{1}, part(3, kMB));
  EXPECT_DOUBLE_EQ(a.owed(JobId{1}), 0.0);
}

TEST(TenantArbiter, CreditIsCappedAtBurst) {
  TenantArbiter a(0.0, kMB);
  a.push(JobId{1}, part(1, kMB));
  a.served(JobId{1}, 100 * kMB);
  EXPECT_DOUBLE_EQ(a.owed(JobId{1}), -static_cast<double>(kMB));
}

TEST(TenantArbiter, RemoveRequestReturnsItsPartsInOrder) {
  TenantArbiter a;
  a.push(JobId{1}, part(7, kMB, 0, 2));
  a.push(JobId{1}, part(7, kMB, 0, 0));
  a.push(JobId{1}, part(8, kMB));
  a.push(JobId{1}, part(7, kMB, 0, 1));
  const auto removed = a.remove_request(JobId{1}, RequestId{7});
  ASSERT_EQ(removed.size(), 3u);
  EXPECT_EQ(removed[0].index, 0u);
  EXPECT_EQ(removed[2].index, 2u);
  EXPECT_EQ(a.remaining(JobId{1}), kMB);
  EXPECT_EQ(a.head()->part.request, RequestId{8});
  EXPECT_TRUE(a.remove_request(JobId{9}, RequestId{8}).empty());
  EXPECT_TRUE(a.remove_request(JobId{1}, RequestId{99}).empty());
}

// Sends `grants` parts the way the scheduler does (head, pop, served) and spells which job got
// each: '1' for job 1 and so on.
std::string send(TenantArbiter& a, int grants) {
  std::string order;
  for (int i = 0; i < grants && !a.empty(); ++i) {
    const JobId job = a.head()->job;
    a.served(job, a.pop(job).length);
    order += std::to_string(static_cast<std::uint32_t>(job));
  }
  return order;
}

// Per-job fair sharing: job 2 declares far less work left and job 1 queued more parts, yet
// each gets equal bytes: one 2 MB part of job 1 for every two 1 MB parts of job 2.
TEST(TenantArbiter, FairSharingGivesEveryBackloggedJobEqualBytes) {
  TenantArbiter a(JobSharing::fair, {});
  for (std::uint64_t i = 0; i < 20; ++i) a.push(JobId{1}, part(100 + i, 2 * kMB), 900 * kMB);
  for (std::uint64_t i = 0; i < 6; ++i) a.push(JobId{2}, part(200 + i, kMB), 6 * kMB);
  EXPECT_EQ(send(a, 9), "122122122");
  EXPECT_EQ(send(a, 3), "111");  // job 2 is done: job 1 alone
}

// A job that joins late starts at the least any backlogged job has been served: it does not
// get the whole NIC until it has caught up with what job 1 sent alone.
TEST(TenantArbiter, FairSharingStartsAJobThatJoinsAtTheBackloggedMinimum) {
  TenantArbiter a(JobSharing::fair, {});
  for (std::uint64_t i = 0; i < 20; ++i) a.push(JobId{1}, part(100 + i, kMB));
  EXPECT_EQ(send(a, 5), "11111");
  for (std::uint64_t i = 0; i < 5; ++i) a.push(JobId{2}, part(200 + i, kMB));
  EXPECT_EQ(send(a, 6), "121212");
}

// Strict priority in the operator's order, whatever the work left: job 3 first, then job 1,
// then the unlisted jobs by id (2 before 4). No floor: job 1 waits while job 3 has parts.
TEST(TenantArbiter, StrictPriorityServesTheListedOrderThenUnlistedJobsById) {
  TenantArbiter a(JobSharing::priority, {JobId{3}, JobId{1}});
  a.push(JobId{4}, part(400, kMB), kMB);
  a.push(JobId{2}, part(200, kMB), kMB);
  a.push(JobId{1}, part(100, kMB), kMB);
  for (std::uint64_t i = 0; i < 3; ++i) a.push(JobId{3}, part(300 + i, kMB), 900 * kMB);
  EXPECT_EQ(send(a, 6), "333124");
}

}  // namespace
}  // namespace gradlane::sched
