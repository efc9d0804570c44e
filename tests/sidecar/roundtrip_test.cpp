// Attach, request, grant, complete, detach — through the real segment, with the daemon loop
// on a thread of this process.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <set>

#include "harness.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

TEST(SidecarRoundTrip, RequestIsGrantedAndCompleted) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  Client client = Client::attach(test_attach(name));
  EXPECT_TRUE(client.attached());
  EXPECT_NE(client.sidecar_generation(), 0U);

  const std::uint64_t id = client.request(small_update(3));
  const Grant g = client.wait(2s);
  EXPECT_EQ(g.kind, GrantKind::go) << reason_name(g.reason);
  EXPECT_EQ(g.request, id);
  EXPECT_EQ(g.target, 9U);
  EXPECT_EQ(g.sequence, 1U);
  EXPECT_EQ(g.part_bytes, 4096U);
  EXPECT_EQ(g.part_count, 1U);
  EXPECT_EQ(client.outstanding(), 0U);
  client.complete(id, 0, 10us);

  client.detach();
  EXPECT_FALSE(client.attached());
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  for (;;) {
    {
      auto hold = driver.hold();
      if (driver.daemon().stats().detached == 1) {
        EXPECT_EQ(driver.daemon().attached_apps(), 0U);
        EXPECT_EQ(driver.daemon().stats().completed, 1U);
        break;
      }
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the daemon never reclaimed the detached slot";
    std::this_thread::sleep_for(1ms);
  }
}

TEST(SidecarRoundTrip, ManyRequestsAreAnsweredInOrderWithIncreasingSequence) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  Client client = Client::attach(test_attach(name));
  std::uint64_t last_sequence = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t id = client.request(small_update());
    const Grant g = client.wait(2s);
    ASSERT_EQ(g.request, id);
    ASSERT_EQ(g.sequence, last_sequence + 1);
    last_sequence = g.sequence;
    client.complete(id, 0, 1us);
  }
}

TEST(SidecarRoundTrip, SegmentIsOwnerOnlyAndHasOneDaemon) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600U);
  try {
    Daemon second(test_config(name), std::make_unique<sched::PassThroughPolicy>());
    FAIL() << "a second daemon took over a live daemon's segment";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("already serves"), std::string::npos) << e.what();
  }
  driver.stop();
  EXPECT_NE(::stat(("/dev/shm" + name).c_str(), &st), 0) << "a stopped daemon must unlink its segment";
}

TEST(SidecarRoundTrip, AllSlotsTakenIsResourceExhausted) {
  const std::string name = unique_shm_name();
  DaemonConfig config = test_config(name);
  config.max_apps = 2;
  DaemonDriver driver(config);
  Client a = Client::attach(test_attach(name));
  Client b = Client::attach(test_attach(name));
  try {
    Client c = Client::attach(test_attach(name));
    FAIL() << "a third app attached to two slots";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::resource_exhausted);
    EXPECT_NE(std::string(e.what()).find("--max-apps"), std::string::npos) << e.what();
  }
  EXPECT_NE(a.slot(), b.slot());
}

TEST(SidecarRoundTrip, WaitWithoutAnswerTimesOut) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  Client client = Client::attach(test_attach(name));
  const auto start = std::chrono::steady_clock::now();
  try {
    client.wait(30ms);
    FAIL() << "wait returned without an answer";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
}

// The production policy: a 10 MiB gradient is cut into parts, each granted a slot and a
// sequence number as credit allows; completing parts frees credit for the rest.
TEST(SidecarRoundTrip, SchedulerPolicyPartitionsGrantsAndTakesCompletions) {
  const std::string name = unique_shm_name();
  sched::SchedulerConfig sc;
  sc.replica_bound = std::nullopt;  // no replica acks in this test
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(sc));
  AttachOptions o = test_attach(name);
  o.region_bytes = 16 << 20;
  Client client = Client::attach(o);

  const std::uint64_t bytes = 10 << 20;
  const std::uint64_t id = client.request(Update{.tensor = 1,
                                                 .receiver = 9,
                                                 .bytes = bytes,
                                                 .region_offset = 0,
                                                 .computed_on = 0,
                                                 .gradient_norm = 2.0F,
                                                 .priority = 0});
  std::uint64_t granted_bytes = 0;
  std::set<std::uint32_t> parts;
  std::uint64_t last_sequence = 0;
  std::uint32_t part_count = 0;
  while (part_count == 0 || parts.size() < part_count) {
    const Grant g = client.wait(2s);
    ASSERT_EQ(g.kind, GrantKind::go) << kind_name(g.kind) << " " << reason_name(g.reason);
    ASSERT_EQ(g.request, id);
    EXPECT_GT(g.sequence, last_sequence);
    EXPECT_GT(g.slot_length.count(), 0);
    last_sequence = g.sequence;
    part_count = g.part_count;
    parts.insert(g.part_index);
    granted_bytes += g.part_bytes;
    client.complete(id, g.part_index, g.slot_length);  // frees credit for the next part
  }
  EXPECT_GT(part_count, 1U);
  EXPECT_EQ(granted_bytes, bytes);
  EXPECT_EQ(client.outstanding(), 0U);
  EXPECT_TRUE(driver.credit_returned(1, 2s)) << "completions never reached the scheduler";
}

// Two jobs' apps on one NIC (endpoint 1), one update each: what each declares it has left
// crosses the shared memory and the daemon serves the job with less left first (sequence 1).
TEST(SidecarRoundTrip, TheJobThatDeclaresLessWorkLeftIsGrantedFirst) {
  for (const bool short_job_declares_less : {true, false}) {
    const std::string name = unique_shm_name();
    sched::SchedulerConfig sc;
    sc.replica_bound = std::nullopt;
    DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(sc));
    Client long_job = Client::attach(test_attach(name, 1));
    Client short_job = Client::attach(test_attach(name, 2));
    Update u = small_update();
    {
      const auto held = driver.hold();  // both requests reach the scheduler in one step
      u.job_remaining = short_job_declares_less ? 90 << 20 : 10 << 20;
      long_job.request(u);
      u.job_remaining = short_job_declares_less ? 30 << 20 : 40 << 20;
      short_job.request(u);
      driver.step();
    }
    const Grant l = long_job.wait(2s), s = short_job.wait(2s);
    ASSERT_EQ(l.kind, GrantKind::go);
    ASSERT_EQ(s.kind, GrantKind::go);
    EXPECT_EQ(short_job_declares_less ? s.sequence : l.sequence, 1U) << "the job with less left goes first";
  }
}

// A server app declares its slots at attach: without a replica (no B) gradlaned still grants
// its sequence at most that far past what the server reported applied.
TEST(SidecarRoundTrip, AServersDeclaredSlotsBoundItsGrantsAheadOfWhatItApplied) {
  const std::string name = unique_shm_name();
  sched::SchedulerConfig sc;
  sc.replica_bound = std::nullopt;
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(sc));
  AttachOptions as_server = test_attach(name);
  as_server.endpoint = 9;  // small_update()'s receiver
  as_server.slots = 2;
  Client server = Client::attach(as_server);
  Client worker = Client::attach(test_attach(name));
  for (int i = 0; i < 4; ++i) worker.request(small_update());
  EXPECT_EQ(take_and_complete(worker, 2), (std::vector<std::uint64_t>{1, 2}));
  EXPECT_THROW(worker.wait(300ms), Error) << "a third grant ran past the server's 2 slots";
  server.applied(2);
  EXPECT_EQ(take_and_complete(worker, 2), (std::vector<std::uint64_t>{3, 4}));
}

}  // namespace
}  // namespace gradlane::sidecar::test
