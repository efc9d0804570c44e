// A process's identity and its end as the daemon reads them from /proc: a live process is
// neither exited nor exiting; one that has exited (a zombie not yet reaped) or whose pid is
// free is gone, to its watch and to process_exiting, which the daemon asks before it hands a
// receiver whose server died over to a peer.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "sidecar/shm/process.hpp"

namespace gradlane::sidecar {
namespace {

using namespace std::chrono_literals;

TEST(ProcessIdentity, ALiveProcessIsNotExitingAndItsWatchSaysAlive) {
  const auto start = process_start_time(::getpid());
  ASSERT_TRUE(start.has_value());
  EXPECT_TRUE(process_alive(::getpid(), *start));
  EXPECT_FALSE(process_alive(::getpid(), *start + 1)) << "another start time is another process";
  EXPECT_FALSE(process_exiting(::getpid()));
  const auto watch = ProcessWatch::open(::getpid(), *start);
  ASSERT_TRUE(watch.has_value());
  EXPECT_TRUE(watch->alive());
  EXPECT_FALSE(watch->exiting());
}

TEST(ProcessIdentity, AnExitedChildIsGoneBeforeItIsReaped) {
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(go[1]);
    char byte = 0;
    [[maybe_unused]] const auto n = ::read(go[0], &byte, 1);
    ::_exit(0);
  }
  const auto start = process_start_time(child);
  ASSERT_TRUE(start.has_value());
  const auto watch = ProcessWatch::open(child, *start);
  ASSERT_TRUE(watch.has_value());
  EXPECT_FALSE(watch->exiting()) << "still blocked in read";
  EXPECT_FALSE(process_exiting(child));
  ::close(go[1]);  // its read returns: it exits, a zombie until we reap it
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (watch->alive() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(watch->alive());
  EXPECT_TRUE(watch->exiting());
  EXPECT_TRUE(process_exiting(child)) << "a zombie has exited";
  if (watch->alive()) ::kill(child, SIGKILL);  // the checks above failed: do not hang on it
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(go[0]);
  EXPECT_TRUE(process_exiting(child)) << "a reaped pid is gone";
}

}  // namespace
}  // namespace gradlane::sidecar
