// Worker::last_landed over rxe: a restarted worker asks its server which of its pushes it took
// last, so it resumes after it instead of pushing that step again (found by the fault list's
// restart:worker1, seed 1: the worker died between writing step 126 and logging it, came back
// from step 126, and the server applied that step twice).
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradlane/gradlane.hpp"

#include "../common/hosts.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;

TEST(RestartedWorker, LearnsFromTheServerWhichOfItsPushesLandedLast) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
  constexpr std::size_t kFloats = 64;
  constexpr std::uint16_t kPort = 7890;
  ps::ShardOptions shard;
  shard.floats = kFloats;
  shard.slots = 8;
  std::atomic<bool> stop{false}, serving{false};
  std::string server_failure;
  std::vector<ps::AppliedUpdate> history;
  std::jthread server_thread([&] {
    try {
      Device device = Device::open({.name = hosts[0].device});
      ps::ShardServer server(device, ps::Role::server, kPort, shard, std::vector<float>(kFloats, 0.0F));
      serving = true;
      server.accept_peers(1, 60s);
      while (!stop.load()) {
        if (server.progress() == 0) server.wait_for_input(5ms);
      }
      history = server.history();
    } catch (const std::exception& e) {
      server_failure = e.what();
    }
  });
  while (!serving.load()) std::this_thread::sleep_for(1ms);

  Device device = Device::open({.name = hosts[2].device});
  ps::WorkerOptions options;
  options.id = 1;
  options.server = {hosts[0].address, kPort};
  options.floats = kFloats;
  options.timeout = 30s;
  std::vector<std::uint64_t> sequences;
  std::optional<ps::LandedPush> first_life_answer, second_life_answer, before_any_push, other_worker;
  try {
    ps::Worker first_life(device, options);
    before_any_push = first_life.last_landed();
    for (std::uint64_t tag = 10; tag < 15; ++tag) {
      std::fill(first_life.gradient().begin(), first_life.gradient().end(), static_cast<float>(tag));
      const ps::PushResult pushed = first_life.push(/*computed_on=*/tag - 10, tag);
      ASSERT_FALSE(pushed.lost || pushed.dropped) << "push of tag " << tag;
      sequences.push_back(pushed.sequence);
    }
    first_life_answer = first_life.last_landed();
    // The second life connects while the first still looks alive to the server: it supersedes it.
    ps::Worker second_life(device, options);
    second_life_answer = second_life.last_landed();
    ps::WorkerOptions other = options;
    other.id = 2;
    ps::Worker never_pushed(device, other);
    other_worker = never_pushed.last_landed();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "worker: " << e.what();
  }
  stop = true;
  server_thread.join();
  ASSERT_EQ(server_failure, "");
  ASSERT_EQ(sequences.size(), 5u);

  EXPECT_FALSE(before_any_push.has_value()) << "a worker that pushed nothing was told step " << before_any_push->tag;
  for (const auto& [life, answer] : {std::pair{"first", first_life_answer}, std::pair{"second", second_life_answer}}) {
    ASSERT_TRUE(answer.has_value()) << "the " << life << " life was told none of its pushes landed";
    EXPECT_EQ(answer->tag, 14u) << life;
    EXPECT_EQ(answer->sequence, sequences.back()) << life;
    EXPECT_EQ(answer->computed_on, 4u) << life;
  }
  EXPECT_FALSE(other_worker.has_value()) << "worker 2 was told of another worker's push";
  // The server applied each push once, worker 1's tags in order.
  std::vector<std::uint64_t> applied_tags;
  for (const auto& u : history) {
    if (!u.skipped && u.worker == 1) applied_tags.push_back(u.tag);
  }
  EXPECT_EQ(applied_tags, (std::vector<std::uint64_t>{10, 11, 12, 13, 14}));
}

}  // namespace
}  // namespace gradlane::testing
