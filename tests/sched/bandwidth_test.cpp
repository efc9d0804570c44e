#include "sidecar/core/bandwidth.hpp"

#include <gtest/gtest.h>

#include "sched_test_util.hpp"

namespace gradlane::sched {
namespace {

using testing::ep;
using testing::kGBps;
using testing::us;

TEST(Bandwidth, UnknownEndpointsUseTheDefault) {
  const BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 0.5, 1e6});
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 10 * kGBps);
  EXPECT_EQ(bw.transfer_time(ep(1), ep(2), 1'000'000), us(100));
}

TEST(Bandwidth, TransferTimeIsBytesOverTheBottleneckRoundedUp) {
  BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 0.5, 1e6});
  bw.set_rate(ep(1), Direction::egress, 2 * kGBps);
  EXPECT_DOUBLE_EQ(bw.path_rate(ep(1), ep(2)), 2 * kGBps);
  EXPECT_EQ(bw.transfer_time(ep(1), ep(2), 1'000'000), us(500));
  EXPECT_EQ(transfer_time(1, 3e9), Nanos{1});  // 0.33 ns rounds up, never 0
  EXPECT_EQ(transfer_time(0, 3e9), Nanos{0});
}

TEST(Bandwidth, EwmaMovesByTheWeight) {
  BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 0.25, 1e6});
  // One sample of 6 GB/s on the egress side: 10 -> 0.75 * 10 + 0.25 * 6 = 9 GB/s.
  bw.observe(ep(1), Direction::egress, 6'000'000, us(1000));
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 9 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::ingress), 10 * kGBps);
}

TEST(Bandwidth, ASlowSenderDoesNotDragDownAHealthyServer) {
  BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 0.5, 1e6});
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
  BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 0.5, 1e6});
  bw.set_rate(ep(1), Direction::egress, 2 * kGBps);
  bw.set_rate(ep(100), Direction::ingress, 4 * kGBps);
  bw.observe_transfer(ep(1), ep(100), 3'000'000, us(1000));  // 3 GB/s: sender >= 3
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 2.5 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 4 * kGBps);
}

TEST(Bandwidth, OnATieTheSenderIsBlamed) {
  BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 0.5, 1e6});
  bw.observe_transfer(ep(9), ep(100), 6'000'000, us(1000));  // 6 GB/s, both at 10: tie
  EXPECT_DOUBLE_EQ(bw.rate(ep(9), Direction::egress), 8 * kGBps);
  EXPECT_DOUBLE_EQ(bw.rate(ep(100), Direction::ingress), 10 * kGBps);
}

TEST(Bandwidth, AGrossErrorIsBelievedAtOnce) {
  BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 0.25, 1e6});
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
  BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 0.5, 1e6});
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

TEST(Bandwidth, SmallDriftIsNotRepublished) {
  BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 0.25, 1e6});
  const auto gen = bw.generation();
  bw.observe(ep(1), Direction::egress, 9'980'000, us(1000));  // 9.98 GB/s: 0.05% drift
  EXPECT_EQ(bw.generation(), gen);
  EXPECT_DOUBLE_EQ(bw.rate(ep(1), Direction::egress), 10 * kGBps);
  for (int i = 0; i < 20; ++i) bw.observe(ep(1), Direction::egress, 9'500'000, us(1000));
  EXPECT_NE(bw.generation(), gen);  // the EWMA drifted past 1%: published
  EXPECT_LT(bw.rate(ep(1), Direction::egress), 9.9 * kGBps);
}

TEST(Bandwidth, BadSamplesAreIgnoredAndTheFloorHolds) {
  BandwidthEstimator bw(BandwidthConfig{10 * kGBps, 1.0, 1e6});
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
