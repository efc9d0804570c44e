// gradlaned's metrics (sidecar/daemon/daemon_metrics.hpp) through the real segment: what the
// daemon decided, and each sender's push time from submission to its completion, with the
// sender that holds its grants longest scored the straggler.
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "harness.hpp"
#include "sidecar/daemon/daemon_metrics.hpp"
#include "tests/common/scrape.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;
using gradlane::test::sample_value;

TEST(DaemonMetrics, CountDecisionsAndScoreTheSenderWhosePushesTakeLongest) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  AttachOptions fast_options = test_attach(name);
  AttachOptions slow_options = test_attach(name);
  slow_options.endpoint = 2;
  Client fast = Client::attach(fast_options);
  Client slow = Client::attach(slow_options);
  constexpr int kPushes = 5;
  for (int i = 0; i < kPushes; ++i) {
    for (Client* app : {&fast, &slow}) {
      const std::uint64_t id = app->request(small_update());
      const Grant g = app->wait(2s);
      ASSERT_EQ(g.kind, GrantKind::go) << reason_name(g.reason);
      if (app == &slow) std::this_thread::sleep_for(20ms);  // a slow link: its writes take longer
      app->complete(id, 0, 10us);
    }
  }
  for (const auto deadline = std::chrono::steady_clock::now() + 5s; driver.stats().completed < 2 * kPushes;) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the daemon never took every completion";
    std::this_thread::sleep_for(1ms);
  }
  DaemonMetrics metrics;
  {
    auto hold = driver.hold();
    metrics.update(driver.daemon());
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, metrics.Collect());
  const std::string text = out.str();
  EXPECT_EQ(sample_value(text, "gradlaned_decisions_total{kind=\"grant\"}"), 2.0 * kPushes) << text;
  EXPECT_EQ(sample_value(text, "gradlaned_drops_total{reason=\"stale\"}"), 0.0);
  EXPECT_EQ(sample_value(text, "gradlaned_entries_total{entry=\"submitted\"}"), 2.0 * kPushes);
  EXPECT_EQ(sample_value(text, "gradlaned_granted_bytes_total"), 2.0 * kPushes * 4096);
  EXPECT_EQ(sample_value(text, "gradlaned_apps"), 2.0);
  EXPECT_EQ(sample_value(text, "gradlaned_push_seconds_count{sender=\"1\"}"), kPushes);
  EXPECT_EQ(sample_value(text, "gradlaned_push_seconds_count{sender=\"2\"}"), kPushes);
  EXPECT_GE(*sample_value(text, "gradlaned_push_seconds_sum{sender=\"2\"}"), kPushes * 0.020);
  const double slow_score = *sample_value(text, "gradlaned_straggler_score{sender=\"2\"}");
  const double fast_score = *sample_value(text, "gradlaned_straggler_score{sender=\"1\"}");
  EXPECT_GT(slow_score, 1.0) << text;
  EXPECT_LT(fast_score, 1.0) << text;
}

TEST(ScheduleRecord, SendersPastTheBoundShareOneHistogram) {
  ScheduleRecord record;
  const std::size_t senders = ScheduleRecord::kMaxSenders + 6;
  for (std::uint32_t sender = 1; sender <= senders; ++sender) record.settled(sender, std::chrono::milliseconds(1));
  record.settled(1, std::chrono::milliseconds(1));  // a known sender keeps its own
  EXPECT_EQ(record.push_seconds().size(), ScheduleRecord::kMaxSenders + 1);
  EXPECT_EQ(record.push_seconds().at(ScheduleRecord::kOtherSenders).count(), 6U);
  EXPECT_EQ(record.push_seconds().at(1).count(), 2U);
}

}  // namespace
}  // namespace gradlane::sidecar::test
