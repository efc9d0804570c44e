#include "sidecar/core/bandwidth.hpp"

#include <gtest/gtest.h>

#include "sched_test_util.hpp"

namespace gradlane::sched {
namespace {

using testing::ep;
using testing::kGBps;
using testing::us;

using testing::bandwidth_config;

TEST(Bandwidth, UnknownEndpointsUseTheDefault) {
  const BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 10 * kGBps);
  EXPECT_EQ(bw.transfer_time(ep(1), ep(2), 1'000'000), us(100));
}

TEST(Bandwidth, TransferTimeIsBytesOverTheBottleneckRoundedUp) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  bw.set_rate(ep(1), Direction::egress, 2 * kGBps);
  EXPECT_DOUBLE_EQ(bw.path_rate(ep(1), ep(2)), 2 * kGBps);
  EXPECT_EQ(bw.transfer_time(ep(1), ep(2), 1'000'000), us(500));
  EXPECT_EQ(transfer_time(1, 3e9), Nanos{1});  // 0.33 ns rounds up, never 0
  EXPECT_EQ(transfer_time(0, 3e9), Nanos{0});
}

TEST(Bandwidth, EwmaMovesByTheWeight) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.25, 1e6));
  // One sample of 6 GB/s on the egress side, averaged as time per byte:
  // 10 -> 1 / (0.75 / 10 + 0.25 / 6) = 8.57 GB/s.
  bw.observe(ep(1), Direction::egress, 6'000'000, us(1000));
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), kGBps / (0.75 / 10 + 0.25 / 6));
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::ingress), 10 * kGBps);
}

TEST(Bandwidth, ASlowSenderDoesNotDragDownAHealthyServer) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  bw.set_rate(ep(9), Direction::egress, 1 * kGBps);          // already known slow
  bw.observe_transfer(ep(9), ep(100), 1'000'000, us(1000));  // 1 GB/s observed
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 1 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
  // Slower still: blame the believed bottleneck (the sender) only.
  bw.observe_transfer(ep(9), ep(100), 500'000, us(1000));  // 0.5 GB/s
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), kGBps / (0.5 / 1 + 0.5 / 0.5));
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
}

TEST(Bandwidth, AFastObservationRaisesWhicheverSideIsBelowIt) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  bw.set_rate(ep(1), Direction::egress, 2 * kGBps);
  bw.set_rate(ep(100), Direction::ingress, 4 * kGBps);
  bw.observe_transfer(ep(1), ep(100), 3'000'000, us(1000));  // 3 GB/s: sender >= 3
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), kGBps / (0.5 / 2 + 0.5 / 3));
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 4 * kGBps);
}

TEST(Bandwidth, OnATieTheSenderIsBlamed) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  bw.observe_transfer(ep(9), ep(100), 6'000'000, us(1000));  // 6 GB/s, both at 10: tie
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), kGBps / (0.5 / 10 + 0.5 / 6));
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
}

TEST(Bandwidth, AGrossErrorIsBelievedAtOnce) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.25, 1e6));
  // 100x slower than declared: averaging would take ~16 samples to get there.
  bw.observe_transfer(ep(9), ep(100), 100'000, us(1000));  // 0.1 GB/s
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 0.1 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
  // Good news is averaged in, as time per byte: one transfer 100x faster barely moves it.
  bw.observe(ep(9), Direction::egress, 10'000'000, us(1000));  // 10 GB/s
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), kGBps / (0.75 / 0.1 + 0.25 / 10));
}

// A slow server: once its senders are believed slow, their next slow transfers fall below the
// server's estimate only, and the blame moves to the server.
TEST(Bandwidth, ASlowServerIsFoundThroughItsSenders) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  bw.set_rate(ep(1), Direction::egress, 4 * kGBps);  // sender known at 4
  bw.set_rate(ep(100), Direction::ingress, 5 * kGBps);
  bw.observe_transfer(ep(1), ep(100), 3'000'000, us(1000));  // 3 GB/s: below both, blame 1
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), kGBps / (0.5 / 4 + 0.5 / 3));
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 5 * kGBps);
  bw.set_rate(ep(2), Direction::egress, 8 * kGBps);
  bw.observe_transfer(ep(2), ep(100), 3'000'000, us(1000));  // server (5) is now the lower
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), kGBps / (0.5 / 5 + 0.5 / 3));
  EXPECT_DOUBLE_EQ(bw.rate(ep(2), Direction::egress), 8 * kGBps);
}

// A server whose ingress is known to be narrow (declared, as gradlaned --link-rate does): a
// straggler's much slower transfer to it is the straggler's egress, not the server's ingress,
// though the server's estimate is the lower one. Fast senders' transfers at the server's rate
// still tune the server's estimate.
TEST(Bandwidth, ASideThatCarriedClearlyMoreIsNotBlamed) {
  BandwidthEstimator bw;                                         // the defaults: 12.5 GB/s, floor 10 kB/s
  bw.set_rate(ep(100), Direction::ingress, 500'000);             // 4 Mbit/s, declared
  bw.observe_transfer(ep(9), ep(100), 31'250, us(250'000));      // 125 kB/s: 4x slower
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 125'000);  // a gross error: at once
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 500'000);
  bw.observe_transfer(ep(1), ep(100), 31'250, us(69'444));        // 450 kB/s from a fast sender
  EXPECT_NEAR(bw.rate(ep(100), Direction::ingress), 486'487, 1);  // 1 / (0.75/500 + 0.25/450)
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 12.5e9);
  // Nobody carried clearly more than a sample: the believed bottleneck takes the blame again.
  BandwidthEstimator fresh;
  fresh.set_rate(ep(100), Direction::ingress, 500'000);
  fresh.observe_transfer(ep(9), ep(100), 31'250, us(90'000));  // 347 kB/s: not 1.5x below
  EXPECT_LT(fresh.rate(ep(100), Direction::ingress), 500'000);
  EXPECT_DOUBLE_EQ(fresh.rate(ep(9), Direction::egress), 12.5e9);
}

// Between two known sides, what each recently carried does not move the blame: a sender that
// still remembers its declared rate is not cleared against a server that only remembers its
// last senders' rates. The simulator's workers (a few transfers each, links slowing and
// recovering) otherwise dragged the server's ingress estimate far below its rate.
TEST(Bandwidth, BetweenKnownSidesTheEstimatesDecide) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.25, 1e6));
  bw.set_rate(ep(100), Direction::ingress, 10 * kGBps);
  bw.set_rate(ep(1), Direction::egress, 10 * kGBps);
  bw.set_rate(ep(2), Direction::egress, 10 * kGBps);
  for (int i = 0; i < 40; ++i) bw.observe_transfer(ep(2), ep(100), 4'000'000, us(1000));  // 4 GB/s
  EXPECT_DOUBLE_EQ(bw.rate(ep(2), Direction::egress), 4 * kGBps);
  bw.observe_transfer(ep(1), ep(100), 5'000'000, us(1000));  // 5 GB/s: a tie, the sender
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), kGBps / (0.75 / 10 + 0.25 / 5));
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
}

// A straggler behind a token bucket (tc tbf) whose burst lets one update in three through at
// line rate: the estimate must predict the time its transfers take on average, not be swung
// up by each burst. Its mean is 167.5 ms per 31,250 bytes, 187 kB/s. Averaged as rates, each
// burst lifted the estimate above 3 MB/s and the next slot was sized for a fraction of the
// real transfer; averaged as times it stays within 20 % of the mean.
TEST(Bandwidth, OccasionalBurstsDoNotHideASlowLink) {
  BandwidthEstimator bw;  // the defaults: weight 0.25
  double highest = 0;
  double lowest = 1e12;
  for (int round = 0; round < 30; ++round) {
    for (const std::int64_t t : {250'000, 250'000, 2'500}) {  // 125 kB/s twice, 12.5 MB/s
      bw.observe(ep(9), Direction::egress, 31'250, us(t));
      if (round < 5) continue;  // past the start from the 12.5 GB/s default
      highest = std::max(highest, bw.rate(ep(9), Direction::egress));
      lowest = std::min(lowest, bw.rate(ep(9), Direction::egress));
    }
  }
  const double mean_rate = 3 * 31'250 / 0.5025;
  EXPECT_LT(highest, 1.2 * mean_rate);
  EXPECT_GT(lowest, 0.8 * mean_rate);
}

// A worker that mirrors each update to the replica sends it twice meanwhile: a 500 ms transfer
// of 31,250 bytes is 125 kB/s on its egress (both copies) and 62.5 kB/s into the server. Taken
// as one copy, its egress would be believed half as fast as it is, and its writes to an
// aggregator (one copy) planned twice as long.
TEST(Bandwidth, AMirroringSendersEgressCarriesBothCopies) {
  BandwidthEstimator bw;
  bw.set_rate(ep(100), Direction::ingress, 500'000);  // declared: carried, not blamed
  bw.observe_transfer(ep(9), ep(100), 31'250, us(500'000), 2);
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 125'000);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 500'000);
  EXPECT_EQ(bw.transfer_time(ep(9), ep(100), 31'250, 2), us(500'000));  // mirrored again
  EXPECT_EQ(bw.transfer_time(ep(9), ep(4), 31'250), us(250'000));       // one copy
  // One copy through a narrow ingress: the ingress is the bottleneck, the copies are not.
  EXPECT_EQ(mirrored_transfer_time(1'000, 2, 1e6, 1e5), us(10'000));
  EXPECT_EQ(mirrored_transfer_time(1'000, 2, 1e6, 1e6), us(2'000));
  EXPECT_EQ(mirrored_transfer_time(1'000, 1, 1e6, 1e5), transfer_time(1'000, 1e5));
}

TEST(Bandwidth, TheDefaultFloorAdmitsMegabitLinks) {
  BandwidthEstimator bw;
  bw.set_rate(ep(3), Direction::egress, 125'000);  // 1 Mbit/s, as the CI's straggler
  EXPECT_DOUBLE_EQ(bw.rate(ep(3), Direction::egress), 125'000);
}

TEST(Bandwidth, SmallDriftIsNotRepublished) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.25, 1e6));
  const auto gen = bw.generation();
  bw.observe(ep(1), Direction::egress, 9'980'000, us(1000));  // 9.98 GB/s: 0.05% drift
  EXPECT_EQ(bw.generation(), gen);
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 10 * kGBps);
  for (int i = 0; i < 20; ++i) bw.observe(ep(1), Direction::egress, 9'500'000, us(1000));
  EXPECT_NE(bw.generation(), gen);  // the EWMA drifted past 1%: published
  EXPECT_LT(bw.rate(ep(1), Direction::egress), 9.9 * kGBps);
}

TEST(Bandwidth, BadSamplesAreIgnoredAndTheFloorHolds) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 1.0, 1e6));
  const auto gen = bw.generation();
  bw.observe(ep(1), Direction::egress, 1000, Nanos{0});
  bw.observe(ep(1), Direction::egress, 0, us(1));
  EXPECT_EQ(bw.generation(), gen);
  bw.observe(ep(1), Direction::egress, 1, Nanos{1'000'000'000});  // 1 B/s
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 1e6);
  EXPECT_NE(bw.generation(), gen);
}

}  // namespace
}  // namespace gradlane::sched
