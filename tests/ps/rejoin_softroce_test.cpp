// Joining and rejoining over rxe. A worker that does not fit the shard is told why, and so is
// the server's operator; a push computed on a version the server never reached is refused.
// Worker::last_landed: a restarted worker asks its server which of its
// pushes it took last, so it resumes after it instead of pushing that step again (a worker can
// die between writing a step and logging it; pushed again, that step would be applied twice).
// ShardOptions::rejoin_grace: a server whose last worker was lost waits for it to come back
// (the fault list's link:2: without it, workers cut off for 4 s find the job over when the link
// comes back). The baselines' server features: backup workers' rounds (ShardOptions::round)
// and stale-synchronous parallel's clocks (ShardOptions::clock_workers).
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradlane/gradlane.hpp"

#include "../common/external_process.hpp"
#include "../common/hosts.hpp"
#include "ps_run.hpp"
#include "server_thread.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kFloats = 64;

ps::ShardOptions small_shard() {
  ps::ShardOptions shard;
  shard.floats = kFloats;
  shard.slots = 8;
  return shard;
}

ps::WorkerOptions worker_of(const Host& server, std::uint16_t port) {
  ps::WorkerOptions options;
  options.id = 1;
  options.server = {server.address, port};
  options.floats = kFloats;
  options.timeout = 30s;
  return options;
}

// `count` workers, ids 1..count, of the server at `server`:`port`.
std::vector<ps::Worker> connect_workers(const Device& device, const Host& server, std::uint16_t port,
                                        std::uint32_t count) {
  std::vector<ps::Worker> workers;
  for (std::uint32_t id = 1; id <= count; ++id) {
    ps::WorkerOptions options = worker_of(server, port);
    options.id = id;
    workers.emplace_back(device, options);
  }
  return workers;
}

std::vector<std::uint64_t> applied_tags_of(const std::vector<ps::AppliedUpdate>& history, std::uint32_t worker) {
  std::vector<std::uint64_t> tags;
  for (const auto& u : history) {
    if (!u.skipped && u.worker == worker) tags.push_back(u.tag);
  }
  return tags;
}

TEST(MisfitWorker, OfAnotherModelSizeIsToldWhyAndSoIsTheServersLog) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::uint16_t kPort = 7894;
  ::testing::internal::CaptureStderr();
  ServerThread server(hosts[0], kPort, 1, kFloats);
  Device device = Device::open({.name = hosts[2].device});
  std::string worker_error;
  ps::WorkerOptions misfit = worker_of(hosts[0], kPort);
  misfit.floats = 2 * kFloats;
  try {
    ps::Worker worker(device, misfit);
  } catch (const Error& e) {
    worker_error = e.what();
  }
  // The server goes on: a worker that fits joins and pushes.
  std::vector<std::uint64_t> sequences;
  try {
    ps::Worker fits(device, worker_of(hosts[0], kPort));
    sequences.push_back(fits.push(0, 1).sequence);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "worker: " << e.what();
  }
  server.stop();
  const std::string server_log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(server.failure, "");
  EXPECT_NE(worker_error.find("same model"), std::string::npos) << "the worker's error: " << worker_error;
  EXPECT_NE(server_log.find("left before its hello"), std::string::npos) << server_log;
  EXPECT_NE(server_log.find("same number of floats"), std::string::npos) << server_log;
  EXPECT_EQ(server_log.find("was not a hello"), std::string::npos) << server_log;
  EXPECT_EQ(sequences, (std::vector<std::uint64_t>{1}));
}

TEST(MisfitWorker, APushComputedOnAVersionTheServerNeverReachedIsRefused) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::uint16_t kPort = 7896;
  ServerThread server(hosts[0], kPort, 1, kFloats);
  Device device = Device::open({.name = hosts[2].device});
  std::string refusal;
  std::optional<ps::PushResult> after;
  try {
    ps::Worker worker(device, worker_of(hosts[0], kPort));
    (void)worker.push(0, 1);
    try {
      (void)worker.push(/*computed_on=*/7, 2);  // one sequence granted: version 1 at most
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      refusal = e.what();
    }
    after = worker.push(1, 3);  // the worker goes on
  } catch (const std::exception& e) {
    ADD_FAILURE() << "worker: " << e.what();
  }
  server.stop();
  ASSERT_EQ(server.failure, "");
  EXPECT_NE(refusal.find("computed on version 7"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("granted only up to 1"), std::string::npos) << refusal;
  ASSERT_TRUE(after.has_value());
  EXPECT_FALSE(after->lost || after->dropped);
  EXPECT_EQ(after->sequence, 2u) << "the refused push took no sequence";
  EXPECT_EQ(server.stats.refused_requests, 1u);
  EXPECT_EQ(applied_tags_of(server.history, 1), (std::vector<std::uint64_t>{1, 3}));
}

// Backup workers: rounds of 2 updates, 3 workers; a round's third request is refused before it
// is written and takes no sequence, and a push computed on the next round's model is taken.
TEST(BackupWorkers, ARoundTakesItsFirstRequestsAndDropsTheRestUnwritten) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::uint16_t kPort = 7897;
  ps::ShardOptions shard = small_shard();
  shard.round = 2;
  ServerThread server(hosts[0], kPort, 3, shard);
  Device device = Device::open({.name = hosts[2].device});
  std::vector<std::uint64_t> sequences;  // 0: dropped
  const auto note = [&](const ps::PushResult& r) {
    EXPECT_FALSE(r.lost);
    EXPECT_EQ(r.dropped, r.sequence == 0);
    sequences.push_back(r.sequence);
  };
  try {
    std::vector<ps::Worker> workers = connect_workers(device, hosts[0], kPort, 3);
    note(workers[0].push(0, 10));  // round 0 (versions 0-1): sequences 1 and 2
    note(workers[1].push(0, 20));
    note(workers[2].push(0, 30));  // round 0 is full
    note(workers[2].push(2, 31));  // round 1 (versions 2-3): sequences 3 and 4
    note(workers[0].push(2, 11));
    note(workers[1].push(3, 21));  // computed on version 3, still round 1: full
    note(workers[1].push(4, 22));  // round 2
  } catch (const std::exception& e) {
    ADD_FAILURE() << "worker: " << e.what();
  }
  server.stop();
  ASSERT_EQ(server.failure, "");
  EXPECT_EQ(sequences, (std::vector<std::uint64_t>{1, 2, 0, 3, 4, 0, 5}));
  EXPECT_EQ(server.stats.refused_rounds, 2u);
  EXPECT_EQ(server.stats.skipped, 0u) << "a refused request leaves no hole";
  std::vector<std::uint64_t> tags;
  for (const auto& u : server.history) tags.push_back(u.tag);
  EXPECT_EQ(tags, (std::vector<std::uint64_t>{10, 20, 31, 11, 22}));
}

TEST(BackupWorkers, RoundsAreRefusedInSidecarMode) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 1u) << "needs ci/softroce.sh";
  Device device = Device::open({.name = hosts[0].device});
  ps::ShardOptions shard = small_shard();
  shard.round = 2;
  shard.sidecar = sidecar::AttachOptions{};
  try {
    ps::ShardServer server(device, ps::Role::server, 0, shard, std::vector<float>(kFloats, 0.0F));
    ADD_FAILURE() << "a sidecar-mode server took rounds";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("--staleness-bound"), std::string::npos) << e.what();
  }
}

// Waits until the server decided `version` sequences (the pushes were applied).
void wait_for_version(ps::Worker& worker, std::uint64_t version) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (worker.server_version() < version) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the server did not reach version " << version;
    std::this_thread::sleep_for(1ms);
  }
}

// SSP's clocks: the shard's header carries the least steps done (tag + 1 of the latest applied
// update) over workers 1..clock_workers; another id's updates count for nothing.
TEST(SspClocks, TheShardPublishesTheSlowestWorkersStepsDone) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::uint16_t kPort = 7898;
  ps::ShardOptions shard = small_shard();
  shard.clock_workers = 2;
  ServerThread server(hosts[0], kPort, 3, shard);
  Device device = Device::open({.name = hosts[2].device});
  std::vector<std::uint64_t> slowest;  // after each stage
  std::uint64_t pulled_clock = 0;
  try {
    std::vector<ps::Worker> workers = connect_workers(device, hosts[0], kPort, 3);
    ps::Worker& first = workers[0];
    ps::Worker& second = workers[1];
    ps::Worker& unclocked = workers[2];
    std::uint64_t version = 0;
    const auto push = [&](ps::Worker& w, std::uint64_t step) {
      (void)w.push(version, step);
      wait_for_version(w, ++version);
    };
    for (std::uint64_t step = 0; step < 3; ++step) push(first, step);
    slowest.push_back(first.slowest_clock());  // worker 2 has done nothing: 0
    push(unclocked, 50);
    slowest.push_back(first.slowest_clock());  // still 0: worker 3 is not clocked
    push(second, 0);
    slowest.push_back(second.slowest_clock());  // min(3, 1)
    for (std::uint64_t step = 1; step < 5; ++step) push(second, step);
    slowest.push_back(unclocked.slowest_clock());  // min(3, 5)
    pulled_clock = second.pull().slowest_clock;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "worker: " << e.what();
  }
  server.stop();
  ASSERT_EQ(server.failure, "");
  EXPECT_EQ(slowest, (std::vector<std::uint64_t>{0, 0, 1, 3}));
  EXPECT_EQ(pulled_clock, 3u) << "a pull reads the clock with the model";
  EXPECT_EQ(server.stats.applied, 9u);
}

// What two lives of one worker were told by last_landed(): the first before any push and after
// pushing tags 10..14 (computed on versions 0..4), the second once connected while the first
// still looks alive to the server (it supersedes it).
struct TwoLives {
  std::optional<ps::LandedPush> before_any_push, first, second;
  std::vector<std::uint64_t> sequences;
};
TwoLives two_lives(const Device& device, const ps::WorkerOptions& options) {
  TwoLives lives;
  ps::Worker first_life(device, options);
  lives.before_any_push = first_life.last_landed();
  for (std::uint64_t tag = 10; tag < 15; ++tag) {
    const ps::PushResult pushed = first_life.push(/*computed_on=*/tag - 10, tag);
    EXPECT_FALSE(pushed.lost || pushed.dropped) << "push of tag " << tag;
    lives.sequences.push_back(pushed.sequence);
  }
  lives.first = first_life.last_landed();
  ps::Worker second_life(device, options);
  lives.second = second_life.last_landed();
  return lives;
}

// Both lives told of the last of the five pushes, and the server applied each once, in order.
void expect_told_the_last_push(const TwoLives& lives, const std::vector<ps::AppliedUpdate>& history) {
  ASSERT_EQ(lives.sequences.size(), 5u);
  EXPECT_FALSE(lives.before_any_push.has_value())
      << "a worker that pushed nothing was told step " << lives.before_any_push->tag;
  for (const auto& [life, answer] : {std::pair{"first", lives.first}, std::pair{"second", lives.second}}) {
    ASSERT_TRUE(answer.has_value()) << "the " << life << " life was told none of its pushes landed";
    EXPECT_EQ(answer->tag, 14u) << life;
    EXPECT_EQ(answer->sequence, lives.sequences.back()) << life;
    EXPECT_EQ(answer->computed_on, 4u) << life;
  }
  EXPECT_EQ(applied_tags_of(history, 1), (std::vector<std::uint64_t>{10, 11, 12, 13, 14}));
}

TEST(RestartedWorker, LearnsFromTheServerWhichOfItsPushesLandedLast) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::uint16_t kPort = 7890;
  ServerThread server(hosts[0], kPort, 1, kFloats);
  Device device = Device::open({.name = hosts[2].device});
  const ps::WorkerOptions options = worker_of(hosts[0], kPort);
  TwoLives lives;
  std::optional<ps::LandedPush> other_worker;
  try {
    lives = two_lives(device, options);
    ps::WorkerOptions other = options;
    other.id = 2;
    ps::Worker never_pushed(device, other);
    other_worker = never_pushed.last_landed();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "worker: " << e.what();
  }
  server.stop();
  ASSERT_EQ(server.failure, "");
  expect_told_the_last_push(lives, server.history);
  EXPECT_FALSE(other_worker.has_value()) << "worker 2 was told of another worker's push";
}

// The same in sidecar mode, where a doorbell carries only the sidecar's sequence: the worker
// tells the server each push's tag and version ahead of its write, so a restarted worker
// learns where to resume there too, and the server's history names each push's own tag.
TEST(RestartedWorker, WithSidecarsLearnsWhichOfItsPushesLandedLastToo) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::uint16_t kPort = 7898;
  constexpr const char* kShm = "/gradlane-ps-test-landed";
  const std::string out = fresh_test_dir();
  // One gradlaned for the server's endpoint (0) and the worker's (2): the hosts share a kernel.
  ExternalProcess daemon({GRADLANE_GRADLANED, "--foreground", "--shm-name", kShm, "--device", hosts[0].device,
                          "--endpoint", "0", "--endpoint", "2"},
                         out + "/gradlaned");
  ASSERT_TRUE(wait_for_text(out + "/gradlaned.err", "gradlaned: serving", 60s)) << "gradlaned did not start";
  const auto attach = [&](std::uint32_t endpoint) {
    sidecar::AttachOptions o = sidecar::AttachOptions::from_env();
    o.shm_name = kShm;
    o.job = 1;
    o.endpoint = endpoint;
    return o;
  };
  ps::ShardOptions shard = ServerThread::shard_of(kFloats);
  shard.sidecar = attach(0);
  ServerThread server(hosts[0], kPort, 1, shard);
  Device device = Device::open({.name = hosts[2].device});
  ps::WorkerOptions options = worker_of(hosts[0], kPort);
  options.sidecar = attach(2);
  options.server_endpoint = 0;
  TwoLives lives;
  try {
    lives = two_lives(device, options);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "worker: " << e.what();
  }
  server.stop();
  ASSERT_EQ(server.failure, "");
  expect_told_the_last_push(lives, server.history);
}

TEST(ServerRejoinGrace, AJobWhoseOnlyWorkerWasLostWaitsForItToComeBack) {
  // The worker says hello and vanishes without a Bye (a link down, as the server sees it): the
  // server, left with no worker, must not finish within its grace. The worker comes back under
  // its id, pushes, says Bye: then the job is over, its pushes applied.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::uint16_t kPort = 7892;
  ps::ShardOptions shard = small_shard();
  shard.rejoin_grace = 60s;  // the test ends by the rejoin, long before
  std::atomic<bool> serving{false}, finished{false};
  std::atomic<std::uint64_t> lost{0};
  std::string server_failure;
  std::vector<ps::AppliedUpdate> history;
  std::uint64_t joined = 0;
  std::jthread server_thread([&] {
    try {
      Device device = Device::open({.name = hosts[0].device});
      ps::ShardServer server(device, ps::Role::server, kPort, shard, std::vector<float>(kFloats, 0.0F));
      serving = true;
      server.accept_peers(1, 60s);
      const auto give_up = std::chrono::steady_clock::now() + 120s;
      while (!server.finished() && std::chrono::steady_clock::now() < give_up) {
        if (server.progress() == 0) server.wait_for_input(5ms);
        lost = server.stats().peers_lost;
      }
      finished = server.finished();
      history = server.history();
      joined = server.stats().peers_joined;
    } catch (const std::exception& e) {
      server_failure = e.what();
    }
  });
  while (!serving.load()) std::this_thread::sleep_for(1ms);

  Device device = Device::open({.name = hosts[2].device});
  bool finished_while_gone = false;
  try {
    Connection vanishing = ps::connect_with_retry(device, hosts[0].address, kPort, TransportOptions{}, 60s);
    (void)vanishing.wait_region(ps::kSlotRegionId, 60s);
    vanishing.send(ps::encode(ps::Hello{ps::PeerKind::worker, 1}));
    vanishing.flush(5s);
    vanishing.close();
    const auto give_up = std::chrono::steady_clock::now() + 30s;
    while (lost.load() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
    ASSERT_EQ(lost.load(), 1u) << "the server never saw its worker go";
    // Without the grace the server finishes in the round it loses its last worker.
    std::this_thread::sleep_for(500ms);
    finished_while_gone = finished.load();
    ps::WorkerOptions options = worker_of(hosts[0], kPort);
    options.connect_within = 10s;
    ps::Worker back(device, options);
    for (std::uint64_t tag = 0; tag < 3; ++tag) {
      std::fill(back.gradient().begin(), back.gradient().end(), 1.0F);
      const ps::PushResult pushed = back.push(tag, tag);
      EXPECT_FALSE(pushed.lost || pushed.dropped) << "push " << tag;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "worker: " << e.what();
  }
  server_thread.join();
  ASSERT_EQ(server_failure, "");
  EXPECT_FALSE(finished_while_gone) << "the server finished within its rejoin grace";
  EXPECT_TRUE(finished) << "the server did not finish once the worker that came back said Bye";
  EXPECT_EQ(joined, 1u);
  EXPECT_EQ(applied_tags_of(history, 1), (std::vector<std::uint64_t>{0, 1, 2}));
}

}  // namespace
}  // namespace gradlane::testing
