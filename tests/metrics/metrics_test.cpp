// The metrics library natively: the exporter serves what its sources collect over HTTP, the
// histogram's buckets are cumulative, and the parameter server's sources count what their roles
// counted (from synthetic stats and applied logs, without RDMA).
#include <gtest/gtest.h>

#include <prometheus/text_serializer.h>

#include <chrono>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "gradlane/error.hpp"
#include "gradlane/metrics.hpp"
#include "gradlane/ps/metrics.hpp"
#include "tests/common/scrape.hpp"

namespace gradlane {
namespace {

using test::sample_value;
using test::scrape;

class Fixed final : public prometheus::Collectable {
 public:
  explicit Fixed(double value) : value_(value) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    auto f = metrics::family("test_value", "a value", prometheus::MetricType::Gauge);
    metrics::add_gauge(f, {{"which", "one"}}, value_);
    return {f};
  }

 private:
  double value_;
};

TEST(Exporter, ServesWhatItsSourcesCollectOverHttp) {
  metrics::Exporter exporter("127.0.0.1:0");
  ASSERT_NE(exporter.port(), 0);
  exporter.add(std::make_shared<Fixed>(42));
  const std::string text = scrape("127.0.0.1", exporter.port());
  EXPECT_EQ(sample_value(text, "test_value{which=\"one\"}"), 42.0) << text;
  EXPECT_NE(text.find("# TYPE test_value gauge"), std::string::npos) << text;
  EXPECT_EQ(sample_value(exporter.text(), "test_value{which=\"one\"}"), 42.0);
}

TEST(Exporter, AnAddressWithoutAPortOrInUseIsAClearError) {
  try {
    metrics::Exporter exporter("127.0.0.1");
    FAIL() << "an address without a port was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("ADDRESS:PORT"), std::string::npos) << e.what();
  }
  metrics::Exporter first("127.0.0.1:0");
  const std::string taken = "127.0.0.1:" + std::to_string(first.port());
  try {
    metrics::Exporter second(taken);
    FAIL() << "two exporters listen on " << taken;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::system);
    EXPECT_NE(std::string(e.what()).find(taken), std::string::npos) << e.what();
  }
}

TEST(Histogram, BucketsAreCumulativeAndInfCountsEverything) {
  metrics::Histogram h({1, 2, 4});
  for (const double v : {0.5, 1.0, 1.5, 3.0, 9.0, 9.0}) h.observe(v);
  const auto m = h.metric({});
  ASSERT_EQ(m.histogram.bucket.size(), 4U);
  EXPECT_EQ(m.histogram.bucket[0].cumulative_count, 2U);  // <= 1: 0.5 and 1.0
  EXPECT_EQ(m.histogram.bucket[1].cumulative_count, 3U);  // <= 2
  EXPECT_EQ(m.histogram.bucket[2].cumulative_count, 4U);  // <= 4
  EXPECT_EQ(m.histogram.bucket[3].cumulative_count, 6U);  // +Inf
  EXPECT_EQ(m.histogram.sample_count, 6U);
  EXPECT_DOUBLE_EQ(m.histogram.sample_sum, 24.0);
  EXPECT_THROW(metrics::Histogram({2, 1}), Error);
}

// Four workers; worker 4's updates were computed 9 versions back, the others' 1.
std::vector<ps::AppliedUpdate> applied_log(std::uint64_t updates) {
  std::vector<ps::AppliedUpdate> log;
  for (std::uint64_t s = 1; s <= updates; ++s) {
    const std::uint32_t worker = static_cast<std::uint32_t>((s - 1) % 4 + 1);
    const std::uint64_t staleness = worker == 4 ? 9 : 1;
    log.push_back({s, worker, s, s - 1 >= staleness ? s - 1 - staleness : 0, false});
  }
  return log;
}

TEST(ServerMetrics, CountsTheStatsAndTheStalenessOfEachWorkersUpdates) {
  ps::ServerMetrics m("server", 4096);
  auto log = applied_log(40);
  log.push_back({41, 0, 0, 0, true});  // a hole
  ps::ServerStats stats;
  stats.applied = 40;
  stats.skipped = 1;
  stats.replica_acked = 38;
  stats.has_replica = true;
  stats.peers_lost = 2;
  m.update(stats, log, 41);
  const std::string text = [&] {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, m.Collect());
    return out.str();
  }();
  EXPECT_EQ(sample_value(text, "gradlane_server_updates_total{outcome=\"applied\",role=\"server\"}"), 40.0) << text;
  EXPECT_EQ(sample_value(text, "gradlane_server_updates_total{outcome=\"skipped\",role=\"server\"}"), 1.0);
  EXPECT_EQ(sample_value(text, "gradlane_server_applied_bytes_total{role=\"server\"}"), 40.0 * 4096);
  EXPECT_EQ(sample_value(text, "gradlane_server_replica_lag{role=\"server\"}"), 3.0);
  EXPECT_EQ(sample_value(text, "gradlane_server_peers_total{event=\"lost\",role=\"server\"}"), 2.0);
  EXPECT_EQ(sample_value(text, "gradlane_server_version{role=\"server\"}"), 41.0);
  EXPECT_EQ(sample_value(text, "gradlane_server_worker_updates_total{role=\"server\",worker=\"4\"}"), 10.0);
  // Worker 4's updates 4 and 8 were computed on version 0 (staleness 3 and 7), the 8 after 9 back.
  EXPECT_EQ(sample_value(text, "gradlane_server_worker_staleness_sum{role=\"server\",worker=\"4\"}"), 3.0 + 7 + 8 * 9);
  EXPECT_EQ(sample_value(text, "gradlane_server_staleness_count{role=\"server\"}"), 40.0);
  const double straggler = *sample_value(text, "gradlane_server_worker_straggler_score{role=\"server\",worker=\"4\"}");
  const double typical = *sample_value(text, "gradlane_server_worker_straggler_score{role=\"server\",worker=\"2\"}");
  EXPECT_GT(straggler, 3.0) << text;
  EXPECT_NEAR(typical, 1.0, 0.05) << text;
}

TEST(ServerMetrics, ReplicaLagCountsBeforeTheReplicasFirstAckAndIsZeroWithoutAReplica) {
  const auto lag = [](bool has_replica) {
    ps::ServerMetrics m("server", 4096);
    ps::ServerStats stats;
    stats.applied = 12;
    stats.has_replica = has_replica;  // replica_acked 0: it acknowledged nothing yet
    m.update(stats, applied_log(12), 12);
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, m.Collect());
    return sample_value(out.str(), "gradlane_server_replica_lag{role=\"server\"}");
  };
  EXPECT_EQ(lag(true), 12.0);
  EXPECT_EQ(lag(false), 0.0);
}

TEST(Median, OfOddAndEvenCountsAndOfNone) {
  EXPECT_EQ(metrics::median({3, 1, 2}), 2.0);
  EXPECT_EQ(metrics::median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(metrics::median({}), 0.0);
}

TEST(ServerMetrics, ALaterUpdateCountsOnlyTheNewEntriesOfTheLog) {
  ps::ServerMetrics m("replica", 8);
  const auto log = applied_log(20);
  ps::ServerStats stats;
  m.update(stats, std::span(log).first(12), 12);
  m.update(stats, log, 20);
  m.update(stats, log, 20);  // nothing new
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, m.Collect());
  EXPECT_EQ(sample_value(out.str(), "gradlane_server_staleness_count{role=\"replica\"}"), 20.0) << out.str();
  EXPECT_EQ(sample_value(out.str(), "gradlane_server_worker_updates_total{role=\"replica\",worker=\"1\"}"), 5.0);
}

TEST(WorkerMetrics, CountsPushesByOutcomeAndTimesThem) {
  ps::WorkerMetrics m(7);
  m.record({}, std::chrono::milliseconds(3));
  m.record({.dropped = true}, std::chrono::milliseconds(1));
  m.record({.lost = true}, std::chrono::milliseconds(700));
  m.record({.pending = true}, std::chrono::milliseconds(2));
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, m.Collect());
  const std::string text = out.str();
  for (const char* outcome : {"acknowledged", "dropped", "lost", "pending"}) {
    EXPECT_EQ(sample_value(text, std::string("gradlane_worker_pushes_total{outcome=\"") + outcome + "\",worker=\"7\"}"),
              1.0)
        << outcome << "\n"
        << text;
  }
  EXPECT_EQ(sample_value(text, "gradlane_worker_push_seconds_count{worker=\"7\"}"), 4.0);
  EXPECT_EQ(sample_value(text, "gradlane_worker_push_seconds_bucket{worker=\"7\",le=\"0.005\"}"), 3.0) << text;
  EXPECT_NEAR(*sample_value(text, "gradlane_worker_push_seconds_sum{worker=\"7\"}"), 0.706, 1e-9);
}

TEST(AggregatorMetrics, CountsWhatTheAggregatorCounted) {
  ps::AggregatorMetrics m;
  ps::AggregatorStats stats;
  stats.summed = 12;
  stats.forwarded = 3;
  stats.short_groups = 1;
  m.update(stats);
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, m.Collect());
  EXPECT_EQ(sample_value(out.str(), "gradlane_aggregator_members_total{event=\"summed\"}"), 12.0) << out.str();
  EXPECT_EQ(sample_value(out.str(), "gradlane_aggregator_forwards_total{event=\"forwarded\"}"), 3.0);
  EXPECT_EQ(sample_value(out.str(), "gradlane_aggregator_forwards_total{event=\"short_group\"}"), 1.0);
}

}  // namespace
}  // namespace gradlane
