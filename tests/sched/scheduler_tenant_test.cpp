// Several jobs on one host: the sidecar arbitrates the NIC (MLNet flow prioritization).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "sched_test_util.hpp"
#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched {
namespace {

using namespace testing;

constexpr std::uint32_t kServer = 100;

Request job_request(std::uint64_t id, std::uint32_t job, Bytes bytes) {
  Request r = request(id, 1, kServer, bytes);
  r.job = JobId{job};
  r.tensor = TensorId{job};
  return r;
}

TEST(SchedulerTenants, ShortestRemainingJobGoesFirstOnTheSharedNic) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  Scheduler s(c);
  for (std::uint64_t i = 1; i <= 3; ++i) {
    ASSERT_EQ(s.submit(job_request(i, 1, kMB), at_us(0)), SubmitStatus::accepted);  // 3 MB job
  }
  ASSERT_EQ(s.submit(job_request(10, 2, kMB), at_us(0)), SubmitStatus::accepted);  // 1 MB job
  EXPECT_EQ(granted_ids(s.schedule(at_us(0))), (std::vector<std::uint64_t>{10, 1, 2, 3}));
}

// Two jobs' workers share a NIC with one update each queued: the one whose job has less left to
// send (declared by the application) is granted first; undeclared, the tie goes to job 1.
TEST(SchedulerTenants, TheJobWithLessDeclaredWorkLeftIsGrantedFirst) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  for (const bool declared : {false, true}) {
    Scheduler s(c);
    Request long_job = job_request(1, 1, kMB), short_job = job_request(2, 2, kMB);
    if (declared) {
      long_job.job_remaining = 300 * kMB;
      short_job.job_remaining = 40 * kMB;
    }
    ASSERT_EQ(s.submit(long_job, at_us(0)), SubmitStatus::accepted);
    ASSERT_EQ(s.submit(short_job, at_us(0)), SubmitStatus::accepted);
    EXPECT_EQ(granted_ids(s.schedule(at_us(0))),
              declared ? (std::vector<std::uint64_t>{2, 1}) : (std::vector<std::uint64_t>{1, 2}));
  }
}

// Job 1 is big; job 2 always has one small update queued. One grant per 100 us step (the
// horizon is 0), job 2 refilling as soon as its update is granted: without a floor job 1 would
// never send; with a 25% floor it gets exactly every fourth grant once it is owed a part.
TEST(SchedulerTenants, TheFloorKeepsTheBigJobMoving) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  c.grant_horizon = Nanos{0};
  c.tenant_floor_share = 0.25;
  Scheduler s(c);
  for (std::uint64_t i = 1; i <= 20; ++i) {
    ASSERT_EQ(s.submit(job_request(i, 1, kMB), at_us(0)), SubmitStatus::accepted);
  }
  std::uint64_t next_small = 1000;
  bool small_queued = false;
  std::string order;
  for (int step = 0; step < 13; ++step) {
    const Instant now = at_us(100 * step);
    if (!small_queued) {
      ASSERT_EQ(s.submit(job_request(next_small++, 2, kMB), now), SubmitStatus::accepted);
      small_queued = true;
    }
    const auto grants = only<Grant>(s.schedule(now));
    ASSERT_EQ(grants.size(), 1u) << "step " << step;
    order += grants[0].job == JobId{1} ? 'A' : 'B';
    if (grants[0].job == JobId{2}) small_queued = false;
  }
  EXPECT_EQ(order, "BBBBABBBABBBA");
}

// The baselines reach every NIC's arbiter from the configuration: with the same queue (job 1
// 3 MB, job 2 1 MB), fair sharing alternates and strict priority for job 1 serves it first.
TEST(SchedulerTenants, TheConfiguredJobSharingDecidesTheOrder) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  const auto order = [&](JobSharing sharing, std::vector<JobId> priority) {
    c.job_sharing = sharing;
    c.job_priority = std::move(priority);
    Scheduler s(c);
    for (std::uint64_t i = 1; i <= 3; ++i)
      EXPECT_EQ(s.submit(job_request(i, 1, kMB), at_us(0)), SubmitStatus::accepted);
    EXPECT_EQ(s.submit(job_request(10, 2, kMB), at_us(0)), SubmitStatus::accepted);
    return granted_ids(s.schedule(at_us(0)));
  };
  EXPECT_EQ(order(JobSharing::shortest_remaining, {}), (std::vector<std::uint64_t>{10, 1, 2, 3}));
  EXPECT_EQ(order(JobSharing::fair, {}), (std::vector<std::uint64_t>{1, 10, 2, 3}));
  EXPECT_EQ(order(JobSharing::priority, {JobId{1}}), (std::vector<std::uint64_t>{1, 2, 3, 10}));
}

TEST(SchedulerTenants, StrictPriorityWithoutAnOrderAndAnOrderWithoutItAreRefused) {
  SchedulerConfig c = plain_config();
  c.job_sharing = JobSharing::priority;
  ASSERT_TRUE(c.validate().has_value());
  EXPECT_NE(c.validate()->find("job_priority"), std::string::npos);
  c.job_priority = {JobId{2}, JobId{1}, JobId{2}};
  ASSERT_TRUE(c.validate().has_value());
  EXPECT_NE(c.validate()->find("twice"), std::string::npos);
  c.job_priority = {JobId{2}, JobId{1}};
  EXPECT_FALSE(c.validate().has_value());
  c.job_sharing = JobSharing::fair;  // an order it would ignore
  ASSERT_TRUE(c.validate().has_value());
  EXPECT_NE(c.validate()->find("only under job_sharing priority"), std::string::npos);
}

}  // namespace
}  // namespace gradlane::sched
