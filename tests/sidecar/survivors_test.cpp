// Which servers a restarted gradlaned holds endpoints for, from the records a dead daemon's
// segments left and its owners book (sidecar/daemon/survivors.hpp). The apps of a segment write
// its records, so a job could forge one in its own segment: it must not vouch for another job's
// server, nor win an endpoint the dead daemon gave another job.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "sidecar/daemon/survivors.hpp"

namespace gradlane::sidecar {
namespace {

constexpr std::uint32_t kSharedJob = 1, kOwnJob = 2, kOtherOwnJob = 3;

Survivor server(std::uint32_t endpoint, std::uint32_t job, std::uint32_t pid) {
  return Survivor{.endpoint = endpoint, .pid = pid, .start_time = 1000 + pid, .job = job};
}

bool every_endpoint(std::uint32_t) { return true; }

TEST(SurvivorsToHold, EachSegmentVouchesOnlyForItsOwnJobsServers) {
  // The shared segment: job 1's server of endpoint 9, and a record naming job 2, which has a
  // segment of its own. Job 2's segment: its server of endpoint 5, and one naming job 1.
  const std::vector<SurvivorsIn> segments{
      {std::nullopt, {server(9, kSharedJob, 10), server(7, kOwnJob, 11)}},
      {kOwnJob, {server(5, kOwnJob, 20), server(6, kSharedJob, 21)}},
      {kOtherOwnJob, {}},
  };
  const std::map<std::uint32_t, std::uint32_t> owners{{9, kSharedJob}, {7, kOwnJob}, {5, kOwnJob}, {6, kSharedJob}};
  const auto held = endpoints_to_hold(segments, owners, every_endpoint);
  ASSERT_EQ(held.size(), 2u);
  ASSERT_TRUE(held.contains(9));
  EXPECT_EQ(held.at(9).server.pid, 10u);
  EXPECT_EQ(held.at(9).segment, 0u);
  ASSERT_TRUE(held.contains(5));
  EXPECT_EQ(held.at(5).server.pid, 20u);
  EXPECT_EQ(held.at(5).segment, 1u);
  EXPECT_FALSE(held.contains(7)) << "the shared segment vouched for a job with its own segment";
  EXPECT_FALSE(held.contains(6)) << "job 2's segment vouched for job 1's server";
}

TEST(SurvivorsToHold, ARecordForAnotherJobsEndpointCountsForNothing) {
  // Job 2 writes a server of its own for endpoint 9, which the dead daemon gave job 1, into its
  // own segment: beside job 1's true server, and where no true server names it (job 1's
  // stopped) alike. Only job 1's record counts.
  const std::map<std::uint32_t, std::uint32_t> owners{{9, kSharedJob}, {5, kOwnJob}};
  const std::vector<SurvivorsIn> beside{
      {std::nullopt, {server(9, kSharedJob, 10)}},
      {kOwnJob, {server(9, kOwnJob, 20), server(5, kOwnJob, 21)}},
  };
  const auto held = endpoints_to_hold(beside, owners, every_endpoint);
  ASSERT_TRUE(held.contains(9));
  EXPECT_EQ(held.at(9).server.pid, 10u) << "the true server, not the forged one";
  EXPECT_EQ(held.at(9).segment, 0u);
  EXPECT_EQ(held.at(5).server.pid, 21u) << "job 2's own endpoint is its own";
  const std::vector<SurvivorsIn> alone{{std::nullopt, {}}, {kOwnJob, {server(9, kOwnJob, 20)}}};
  EXPECT_TRUE(endpoints_to_hold(alone, owners, every_endpoint).empty())
      << "job 2 took endpoint 9 over where job 1's server had stopped";
}

TEST(SurvivorsToHold, AnEndpointTheOwnersBookDoesNotNameIsHeldForNobody) {
  // The dead daemon died before it booked the server (or its book was full): its server stops
  // at the refusal of its takeover and its replica takes over.
  const std::vector<SurvivorsIn> segments{{std::nullopt, {server(9, kSharedJob, 10)}}};
  EXPECT_TRUE(endpoints_to_hold(segments, {}, every_endpoint).empty());
}

TEST(SurvivorsToHold, OnlyEndpointsThisDaemonServesAreHeld) {
  const std::vector<SurvivorsIn> segments{{std::nullopt, {server(9, kSharedJob, 10), server(4, kSharedJob, 11)}}};
  const auto held = endpoints_to_hold(segments, {{9, kSharedJob}, {4, kSharedJob}},
                                      [](std::uint32_t endpoint) { return endpoint == 9; });
  EXPECT_EQ(held.size(), 1u);
  EXPECT_TRUE(held.contains(9));
}

}  // namespace
}  // namespace gradlane::sidecar
