// The cluster simulator's network models (perf/sched/cluster.hpp): under `fair` every NIC
// direction is shared max-min fairly by the transfers crossing it, so a plain parameter server
// whose workers write at once fills a scarce server ingress; under `exclusive` each transfer
// holds the ingress alone at its sender's rate.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "perf/sched/cluster.hpp"

namespace gradlane::sched::sim {
namespace {

Instant at_ms(double ms) { return Instant{Nanos{static_cast<std::int64_t>(ms * 1e6)}}; }

// 100 workers offering ~5x what the server ingress can take, their egress uneven (each at
// 1/4..1 of the line rate, redrawn now and then), no straggler.
ClusterParams scarce_server_ingress(Mode mode, NetworkModel network) {
  ClusterParams c;
  c.mode = mode;
  c.network = network;
  c.workers = 100;
  c.bytes = Bytes{64} << 10;
  c.compute_ms = 1.0;
  c.worker_gbps = c.server_gbps = 10.0;
  c.spread = 4.0;
  c.change_ms = 5.0;
  c.stragglers = 0;
  return c;
}

TEST(NetworkModel, FairIsTheDefaultAndBothParse) {
  EXPECT_EQ(ClusterParams{}.network, NetworkModel::fair);
  EXPECT_EQ(parse_network_model("fair"), NetworkModel::fair);
  EXPECT_EQ(parse_network_model("exclusive"), NetworkModel::exclusive);
  EXPECT_STREQ(to_string(NetworkModel::exclusive), "exclusive");
  EXPECT_THROW(parse_network_model("shared"), std::invalid_argument);
}

TEST(NetworkModel, FifoFillsAScarceServerIngressOnlyWhenItsLinksAreShared) {
  constexpr double kMs = 50.0;
  double utilisation[2] = {};
  for (const NetworkModel network : {NetworkModel::fair, NetworkModel::exclusive}) {
    Cluster cluster(scarce_server_ingress(Mode::fifo, network));
    cluster.run_until(at_ms(kMs));
    const ClusterStats& s = cluster.stats();
    const double bytes = server_ingress_byte_utilisation(cluster.params(), s, kMs);
    utilisation[static_cast<int>(network)] = bytes;
    EXPECT_GT(s.applied, 100U) << to_string(network);
    EXPECT_LE(bytes, 1.0 + 1e-9) << to_string(network) << ": more bytes than the line rate carries";
    // The exclusive model reads busy all the time while carrying much less.
    EXPECT_GT(s.server_busy_ms / kMs, 0.95) << to_string(network);
  }
  EXPECT_GT(utilisation[static_cast<int>(NetworkModel::fair)], 0.9);
  EXPECT_LT(utilisation[static_cast<int>(NetworkModel::exclusive)], 0.7);
}

// Two identical workers finish computing at the same instant and push 4 KiB each into a server
// as fast as they are. Shared, both take twice as long and land together; exclusive, the first
// lands after one transfer time and the second after two.
TEST(NetworkModel, TwoSimultaneousPushesShareTheServerIngress) {
  for (const NetworkModel network : {NetworkModel::fair, NetworkModel::exclusive}) {
    ClusterParams c;
    c.mode = Mode::fifo;
    c.network = network;
    c.workers = 2;
    c.bytes = 4096;
    c.compute_ms = 1.0;
    c.jitter = 0.0;
    c.worker_gbps = c.server_gbps = 10.0;
    c.stragglers = 0;
    Cluster cluster(c);
    cluster.run_until(at_ms(1.5));  // the next pushes start at 2 ms and more
    const ClusterStats& s = cluster.stats();
    ASSERT_EQ(s.applied, 2U) << to_string(network);
    const double one_transfer_ms = 4096.0 / (10e9 / 8) * 1e3;
    const double expected = network == NetworkModel::fair ? 4 * one_transfer_ms : 3 * one_transfer_ms;
    EXPECT_NEAR(s.latency_sum_ms, expected, 1e-5) << to_string(network);
    EXPECT_EQ(s.server_ingress_bytes, 2 * 4096U) << to_string(network);
    EXPECT_NEAR(s.server_busy_ms, 2 * one_transfer_ms, 1e-5) << to_string(network);
  }
}

// Work conservation: when every sender is as fast as the server's NIC, the server ingress
// carries its full line rate whenever any transfer is on it — also after one of several
// ends while the others go on (their rates must rise at once, not at the next start).
TEST(NetworkModel, AServerIngressWithAnyTransferOnItCarriesItsLineRate) {
  constexpr double kMs = 30.0;
  ClusterParams c;
  c.mode = Mode::fifo;
  c.workers = 50;
  c.bytes = Bytes{64} << 10;
  c.compute_ms = 1.0;  // +-20 %: pushes start and end at scattered times
  c.worker_gbps = c.server_gbps = 10.0;
  c.stragglers = 0;
  c.pulls = PullCost::free;  // the ingress alone: each nanosecond-rounded pull end would add its error
  for (const std::uint64_t seed : {1, 2, 3}) {
    c.seed = seed;
    Cluster cluster(c);
    cluster.run_until(at_ms(kMs));
    const ClusterStats& s = cluster.stats();
    EXPECT_GT(s.applied, 200U);
    EXPECT_NEAR(server_ingress_byte_utilisation(c, s, kMs), s.server_busy_ms / kMs, 1e-6) << "seed " << seed;
  }
}

// A bandwidth change in the middle of a transfer: the bytes before it crossed at the old rate,
// the rest at the new one, and the transfer's end moves accordingly. One worker, its egress the
// only bottleneck; the rates before and after are read off the bytes carried by two probes (the
// factors are random), the end from the submit-to-applied latency.
TEST(NetworkModel, ABandwidthChangeMidTransferMovesItsEnd) {
  ClusterParams c;
  c.mode = Mode::fifo;
  c.workers = 1;
  c.bytes = Bytes{1} << 20;
  c.compute_ms = 1.0;  // the push starts at 1 ms
  c.jitter = 0.0;
  c.worker_gbps = 10.0;
  c.server_gbps = 100.0;
  c.stragglers = 0;
  c.spread = 4.0;     // egress 1/4..1 of 10 Gb/s: 1 MiB takes 0.84..3.4 ms
  c.change_ms = 1.5;  // every worker redrawn at 1.5 ms (and 3 ms, after the push ended)
  c.change_fraction = 1.0;
  constexpr double kBefore = 0.5, kProbe = 0.1;  // ms of the push before the change; probe after
  const auto carried_by = [&](double ms) {
    Cluster probe(c);
    probe.run_until(at_ms(ms));
    return static_cast<double>(probe.stats().server_ingress_bytes);
  };
  const double rate_before = carried_by(1.0 + kBefore - 1e-6) / (kBefore - 1e-6);  // bytes per ms
  const double rate_after = (carried_by(1.0 + kBefore + kProbe) - rate_before * kBefore) / kProbe;
  ASSERT_GT(rate_before, 0);
  ASSERT_GT(rate_after, 0);
  ASSERT_GT(std::abs(rate_after / rate_before - 1), 0.01) << "the redraw should change the rate";

  Cluster cluster(c);
  cluster.run_until(at_ms(3.0 - 1e-6));
  ASSERT_EQ(cluster.stats().applied, 1U);
  const double expected_ms = kBefore + (static_cast<double>(c.bytes) - rate_before * kBefore) / rate_after;
  EXPECT_NEAR(cluster.stats().latency_sum_ms, expected_ms, 2e-5);
}

}  // namespace
}  // namespace gradlane::sched::sim
