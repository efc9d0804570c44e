// No sidecar, a dead sidecar, and a restarted sidecar, as an application sees them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>
#include <thread>

#include "harness.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

std::chrono::milliseconds since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t);
}

TEST(SidecarAbsent, AttachFailsClearlyWithinTheTimeout) {
  const std::string name = unique_shm_name();
  AttachOptions o = test_attach(name);
  o.attach_timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  try {
    Client::attach(o);
    FAIL() << "attached to nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::sidecar_unavailable);
    const std::string what = e.what();
    EXPECT_NE(what.find("gradlaned --shm-name " + name), std::string::npos) << what;
    EXPECT_NE(what.find("no shared-memory segment"), std::string::npos) << what;
  }
  EXPECT_GE(since(start), 300ms);
  EXPECT_LT(since(start), 1500ms);
}

TEST(SidecarAbsent, SegmentLeftByAKilledDaemonIsRecognisedAsDead) {
  const std::string name = unique_shm_name();
  {
    Child daemon("daemon", {"--shm=" + name});
    ASSERT_TRUE(daemon.ready(5s));
    daemon.kill_now();
  }
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm" + name).c_str(), &st), 0) << "SIGKILL leaves the segment behind";
  AttachOptions o = test_attach(name);
  o.attach_timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  try {
    Client::attach(o);
    FAIL() << "attached to a dead daemon's segment";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::sidecar_unavailable);
    EXPECT_NE(std::string(e.what()).find("is gone"), std::string::npos) << e.what();
  }
  EXPECT_LT(since(start), 1500ms);
  // A new daemon replaces the stale segment.
  DaemonDriver driver(test_config(name));
  Client client = Client::attach(test_attach(name));
  client.request(small_update());
  EXPECT_EQ(client.wait(2s).kind, GrantKind::go);
}

// A server polls its sidecar between other work, so its polls come slowly: the liveness check
// must follow the clock, not the number of polls (4,096 polls at ~1 ms each once meant a dead
// gradlaned was noticed after 4 s, and the app's error came at 6 s).
TEST(SidecarAbsent, ASlowPollLoopNoticesAKilledDaemonByTheClock) {
  const std::string name = unique_shm_name();
  Child daemon("daemon", {"--shm=" + name});
  ASSERT_TRUE(daemon.ready(5s));
  AttachOptions o = test_attach(name);
  o.attach_timeout = 300ms;
  Client client = Client::attach(o);
  daemon.kill_now();
  int polls = 0;
  try {
    for (; polls < 4096; ++polls) {
      ASSERT_FALSE(client.poll().has_value());
      std::this_thread::sleep_for(1ms);
    }
    FAIL() << "4096 polls (over 4 s) did not notice the killed daemon";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::sidecar_unavailable) << e.what();
  }
  // Due after 64 polls and 50 ms, then the 300 ms reattach: a few hundred 1 ms polls.
  EXPECT_LT(polls, 2048);
}

TEST(SidecarRestart, CleanRestartReattachesAndAnswersWhatWasOwed) {
  const std::string name = unique_shm_name();
  auto first = std::make_unique<DaemonDriver>(test_config(name));
  Client client = Client::attach(test_attach(name));
  const std::uint64_t generation = client.sidecar_generation();
  first->pause();  // the request below is never answered by the first daemon
  const std::uint64_t owed = client.request(small_update());
  first->stop();

  DaemonDriver second(test_config(name));
  const Grant restarted = client.wait(2s);
  EXPECT_EQ(restarted.kind, GrantKind::error);
  EXPECT_EQ(restarted.reason, Reason::sidecar_restarted);
  EXPECT_EQ(restarted.request, owed);
  EXPECT_EQ(client.reattachments(), 1U);
  EXPECT_NE(client.sidecar_generation(), generation);

  const std::uint64_t id = client.request(small_update());  // and it carries on
  const Grant g = client.wait(2s);
  EXPECT_EQ(g.kind, GrantKind::go);
  EXPECT_EQ(g.request, id);
}

TEST(SidecarRestart, CrashedDaemonIsReplacedAndAppsContinue) {
  const std::string name = unique_shm_name();
  auto first = std::make_unique<Child>("daemon", std::vector<std::string>{"--shm=" + name});
  ASSERT_TRUE(first->ready(5s));
  Client client = Client::attach(test_attach(name));
  client.request(small_update());
  EXPECT_EQ(client.wait(2s).kind, GrantKind::go);

  first->kill_now();  // no clean stop: the segment still says "running"
  Child second("daemon", {"--shm=" + name});
  ASSERT_TRUE(second.ready(5s));

  const std::uint64_t lost = client.request(small_update());  // lands in the dead daemon's queue
  const auto start = std::chrono::steady_clock::now();
  const Grant restarted = client.wait(3s);
  EXPECT_EQ(restarted.kind, GrantKind::error);
  EXPECT_EQ(restarted.reason, Reason::sidecar_restarted);
  EXPECT_EQ(restarted.request, lost);
  EXPECT_LT(since(start), 1000ms) << "the client should notice a dead daemon quickly";
  EXPECT_EQ(client.reattachments(), 1U);

  const std::uint64_t id = client.request(small_update());
  const Grant g = client.wait(2s);
  EXPECT_EQ(g.kind, GrantKind::go);
  EXPECT_EQ(g.request, id);

  client.detach();
  EXPECT_EQ(second.terminate(), 0) << "gradlaned must stop cleanly on SIGTERM";
  struct stat st {};
  EXPECT_NE(::stat(("/dev/shm" + name).c_str(), &st), 0) << "a daemon stopped by SIGTERM unlinks its segment";
}

// A server app (it declared slots) owns a receiver's sequence through its daemon: when that
// daemon dies, a new one would start the sequence again at 1. So the server gets an error, even
// with a new daemon ready, where a worker app reattaches.
TEST(SidecarRestart, AServerAppDoesNotReattachToANewDaemon) {
  const std::string name = unique_shm_name();
  auto first = std::make_unique<Child>("daemon", std::vector<std::string>{"--shm=" + name});
  ASSERT_TRUE(first->ready(5s));
  AttachOptions as_server = test_attach(name);
  as_server.endpoint = 9;
  as_server.slots = 8;
  Client server = Client::attach(as_server);
  Client worker = Client::attach(test_attach(name));
  first->kill_now();
  Child second("daemon", {"--shm=" + name});
  ASSERT_TRUE(second.ready(5s));
  try {
    for (const auto give_up = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < give_up;) {
      (void)server.poll();
      std::this_thread::sleep_for(1ms);
    }
    FAIL() << "the server app carried on with a new daemon";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::sidecar_unavailable);
    EXPECT_NE(std::string(e.what()).find("does not continue it by itself"), std::string::npos) << e.what();
  }
  // A worker app goes on: its first request lands in the dead daemon's queue and is answered
  // sidecar_restarted on the reattach; the next is granted by the new daemon.
  const std::uint64_t lost = worker.request(small_update());
  const Grant restarted = worker.wait(3s);
  EXPECT_EQ(restarted.reason, Reason::sidecar_restarted);
  EXPECT_EQ(restarted.request, lost);
  const std::uint64_t id = worker.request(small_update());
  const Grant g = worker.wait(3s);
  EXPECT_EQ(g.kind, GrantKind::go);
  EXPECT_EQ(g.request, id);
}

// The server app outlives its daemon and takes its own sequence over at the next one, `slots`
// past where it is (ps::ShardServer does this by itself). The new daemon, finding the server
// alive in its dead predecessor's segment, holds the receiver until then: a grant from 1 would
// put a write into a slot that may hold an update not yet applied. Without the survivor (a
// fresh daemon), the same takeover of an own endpoint is refused.
// A server of `job` outlives its daemon; the new daemon must hold its sequence until that very
// server takes it over. Job 1 shares the daemon's segment; `job_user` gives the job a segment of
// its own (a sealed memfd with no name: the new daemon finds it through the apps' /proc/*/fd).
void a_new_daemon_holds_a_surviving_servers_sequence(std::uint32_t job, std::optional<std::uint32_t> job_user) {
  constexpr std::uint32_t kSlots = 4;
  const std::string name = unique_shm_name();
  std::vector<std::string> daemon_args{"--shm=" + name, "--policy=scheduler"};
  DaemonConfig config = test_config(name);
  if (job_user) {
    daemon_args.push_back("--job-user=" + std::to_string(job) + ":" + std::to_string(*job_user));
    config.job_segments = {{.job = job, .uid = *job_user}};
  }
  auto first = std::make_unique<Child>("daemon", daemon_args);
  ASSERT_TRUE(first->ready(5s));
  AttachOptions as_server = test_attach(name, job);
  as_server.endpoint = 9;
  as_server.slots = kSlots;
  auto server = std::make_unique<Client>(Client::attach(as_server));
  Client worker = Client::attach(test_attach(name, job));
  // The worker asks for sequences first..last one at a time: each is granted, in order.
  const auto granted_in_order = [&](std::uint64_t first_seq, std::uint64_t last_seq) {
    for (std::uint64_t seq = first_seq; seq <= last_seq; ++seq) {
      const std::uint64_t id = worker.request(small_update());
      const Grant g = worker.wait(3s);
      ASSERT_EQ(g.kind, GrantKind::go) << reason_name(g.reason);
      EXPECT_EQ(g.request, id);
      EXPECT_EQ(g.sequence, seq);
      worker.complete(g.request, g.part_index, 10us);
    }
  };
  granted_in_order(1, kSlots);  // the first daemon's window: 4 ahead of 0
  first->kill_now();

  sched::SchedulerConfig sc;
  sc.replica_bound = std::nullopt;
  DaemonDriver second(config, std::make_unique<sched::SchedulerPolicy>(sc));
  // The worker's next request lands in the dead daemon's queue (answered sidecar_restarted on
  // the reattach); the one after reaches the new daemon: held, so no answer.
  const std::uint64_t lost = worker.request(small_update());
  const Grant restarted = worker.wait(3s);
  EXPECT_EQ(restarted.request, lost);
  EXPECT_EQ(restarted.reason, Reason::sidecar_restarted);
  const std::uint64_t waiting = worker.request(small_update());
  try {
    const Grant g = worker.wait(1s);
    ADD_FAILURE() << "the new daemon answered " << kind_name(g.kind) << " (sequence " << g.sequence
                  << ") before the server took its sequence over";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout) << e.what();
  }
  {
    // Another process may not take the held sequence over: only the server that outlived the
    // dead daemon (same pid and start time, job and segment) may.
    Child stranger("app-takes-over", {"--shm=" + name, "--job=" + std::to_string(job)});
    const int status = stranger.wait_exit(10s);
    EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 21)
        << "another process took over the held endpoint (status " << status << ")";
  }
  // The server hears its daemon is gone and takes its sequence over, slots past what it
  // applied (2 here: sequences 1 and 2 arrived and were applied).
  server->applied(2);  // into the dead daemon's queue: the call notices and throws
  try {
    for (const auto give_up = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < give_up;) {
      (void)server->poll();
      std::this_thread::sleep_for(1ms);
    }
    FAIL() << "the server app never noticed its daemon was gone";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::sidecar_unavailable) << e.what();
  }
  server.reset();
  as_server.take_over_at = 2 + kSlots;
  server = std::make_unique<Client>(Client::attach(as_server));
  // The waiting request is dropped (receiver_moved: ask again); the next is granted after the
  // taken-over version, and the server's slots bound the window again from there.
  const Grant moved = worker.wait(3s);
  EXPECT_EQ(moved.request, waiting);
  EXPECT_EQ(moved.kind, GrantKind::drop);
  EXPECT_EQ(moved.reason, Reason::receiver_moved);
  granted_in_order(2 + kSlots + 1, 2 + 2 * kSlots);
  EXPECT_EQ(second.stats().takeovers, 1U);

  // A daemon that found no surviving server refuses the same takeover of an own endpoint.
  server.reset();
  second.stop();
  DaemonDriver fresh(config, std::make_unique<sched::SchedulerPolicy>(sc));
  try {
    Client::attach(as_server);
    ADD_FAILURE() << "a fresh daemon let an app take over endpoint 9's sequence";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad_takeover"), std::string::npos) << e.what();
  }
}

TEST(SidecarRestart, ANewDaemonHoldsASurvivingServersSequenceUntilTheServerTakesItOver) {
  a_new_daemon_holds_a_surviving_servers_sequence(1, std::nullopt);
}

TEST(SidecarRestart, ANewDaemonHoldsTheSequenceOfAServerOnAJobsOwnSegmentToo) {
  // Root attaches as the job (the door lets root have any job's segment); the job's user is
  // only the segment's nominal owner here.
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root: the door gives job 7's segment to its user or root; CI runs as root";
  a_new_daemon_holds_a_surviving_servers_sequence(7, 61007);
}

}  // namespace
}  // namespace gradlane::sidecar::test
