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
  // One sample of 6 GB/s on the egress side: 10 -> 0.75 * 10 + 0.25 * 6 = 9 GB/s.
  bw.observe(ep(1), Direction::egress, 6'000'000, us(1000));
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 9 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::ingress), 10 * kGBps);
}

TEST(Bandwidth, ASlowSenderDoesNotDragDownAHealthyServer) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  bw.set_rate(ep(9), Direction::egress, 1 * kGBps);  // already known slow
  bw.observe_transfer(ep(9), ep(100), 1'000'000, us(1000));  // 1 GB/s observed
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 1 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
  // Slower still: blame the believed bottleneck (the sender) only.
  bw.observe_transfer(ep(9), ep(100), 500'000, us(1000));  // 0.5 GB/s
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 0.75 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
}

TEST(Bandwidth, AFastObservationRaisesWhicheverSideIsBelowIt) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  bw.set_rate(ep(1), Direction::egress, 2 * kGBps);
  bw.set_rate(ep(100), Direction::ingress, 4 * kGBps);
  bw.observe_transfer(ep(1), ep(100), 3'000'000, us(1000));  // 3 GB/s: sender >= 3
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 2.5 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 4 * kGBps);
}

TEST(Bandwidth, OnATieTheSenderIsBlamed) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  bw.observe_transfer(ep(9), ep(100), 6'000'000, us(1000));  // 6 GB/s, both at 10: tie
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 8 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
}

TEST(Bandwidth, AGrossErrorIsBelievedAtOnce) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.25, 1e6));
  // 100x slower than declared: averaging would take ~16 samples to get there.
  bw.observe_transfer(ep(9), ep(100), 100'000, us(1000));  // 0.1 GB/s
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 0.1 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
  // Good news is averaged in.
  bw.observe(ep(9), Direction::egress, 10'000'000, us(1000));  // 10 GB/s
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 0.75 * 0.1 * kGBps + 0.25 * 10 * kGBps);
}

// A slow server: once its senders are believed slow, their next slow transfers fall below the
// server's estimate only, and the blame moves to the server.
TEST(Bandwidth, ASlowServerIsFoundThroughItsSenders) {
  BandwidthEstimator bw(bandwidth_config(10 * kGBps, 0.5, 1e6));
  bw.set_rate(ep(1), Direction::egress, 4 * kGBps);  // sender known at 4
  bw.set_rate(ep(100), Direction::ingress, 5 * kGBps);
  bw.observe_transfer(ep(1), ep(100), 3'000'000, us(1000));  // 3 GB/s: below both, blame 1
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 3.5 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 5 * kGBps);
  bw.set_rate(ep(2), Direction::egress, 8 * kGBps);
  bw.observe_transfer(ep(2), ep(100), 3'000'000, us(1000));  // server (5) is now the lower
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 4 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(2), Direction::egress), 8 * kGBps);
}

// A server whose ingress is known to be narrow (declared, as gradlaned --link-rate does): a
// straggler's much slower transfer to it is the straggler's egress, not the server's ingress,
// though the server's estimate is the lower one. Fast senders' transfers at the server's rate
// still tune the server's estimate.
TEST(Bandwidth, ASideThatCarriedClearlyMoreIsNotBlamed) {
  BandwidthEstimator bw;  // the defaults: 12.5 GB/s, floor 10 kB/s
  bw.set_rate(ep(100), Direction::ingress, 500'000);             // 4 Mbit/s, declared
  bw.observe_transfer(ep(9), ep(100), 31'250, us(250'000));     // 125 kB/s: 4x slower
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 125'000);  // a gross error: at once
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 500'000);
  bw.observe_transfer(ep(1), ep(100), 31'250, us(69'444));      // 450 kB/s from a fast sender
  EXPECT_NEAR(bw.rate(ep(100), Direction::ingress), 487'500, 1);  // 0.75 * 500 + 0.25 * 450
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 12.5e9);
  // Nobody carried clearly more than a sample: the believed bottleneck takes the blame again.
  BandwidthEstimator fresh;
  fresh.set_rate(ep(100), Direction::ingress, 500'000);
  fresh.observe_transfer(ep(9), ep(100), 31'250, us(90'000));   // 347 kB/s: not 1.5x below
  EXPECT_LT(fresh.rate(ep(100), Direction::ingress), 500'000);
  EXPECT_DOUBLE_EQ(fresh.rate(ep(9), Direction::egress), 12.5e9);
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
