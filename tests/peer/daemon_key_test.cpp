// gradlaned refuses to run unauthenticated unless told to: its peer port is on the fabric.
// Natively (no peers, so no RDMA device): the key is checked before anything is set up.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../common/external_process.hpp"
#include "../common/text_file.hpp"

namespace {

using namespace std::chrono_literals;
using gradlane::testing::ExternalProcess;
using gradlane::testing::read_text_file;

const std::string kScratch = fmt::format("/tmp/gradlaned-key-test-{}", ::getpid());

// gradlaned with `args`, none of the key variables in its environment (the harness would add
// GRADLANE_INSECURE=1 to a child's).
std::vector<std::string> gradlaned(const std::string& shm, std::vector<std::string> args) {
  std::vector<std::string> argv{
      "/usr/bin/env",          "-u",           "GRADLANE_JOB_KEY", "-u", "GRADLANE_JOB_KEY_FILE", "GRADLANE_INSECURE=0",
      GRADLANE_TEST_GRADLANED, "--foreground", "--shm-name",       shm};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// Runs a gradlaned that is expected to refuse: its exit status and what it said.
std::pair<int, std::string> refusal(const std::string& shm, std::vector<std::string> args) {
  ExternalProcess d(gradlaned(shm, std::move(args)), kScratch);
  const auto status = d.wait_exit(20s);
  if (!status) {
    d.kill_hard();
    return {-1, "still running after 20 s: " + read_text_file(kScratch + ".err")};
  }
  return {WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, read_text_file(kScratch + ".err")};
}

void write_key(const std::string& path, mode_t mode) {
  ::unlink(path.c_str());
  std::ofstream(path) << "cluster-key-0123\n";
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

// Waits until a started gradlaned says it serves (or exits, or 20 s pass), then stops it.
std::string serve_then_stop(ExternalProcess& d) {
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  std::string err;
  while (std::chrono::steady_clock::now() < give_up) {
    err = read_text_file(kScratch + ".err");
    if (err.find("serving") != std::string::npos) break;
    if (d.wait_exit(0ms)) return err;
    std::this_thread::sleep_for(20ms);
  }
  ::kill(d.pid(), SIGTERM);
  (void)d.wait_exit(10s);
  return read_text_file(kScratch + ".err");
}

TEST(GradlanedKey, WithoutAKeyItRefusesToStartSayingHowToGiveOne) {
  const auto [status, said] = refusal("/gradlane-key-test-a", {});
  EXPECT_EQ(status, 1) << said;
  EXPECT_NE(said.find("no job key"), std::string::npos) << said;
  EXPECT_NE(said.find("GRADLANE_JOB_KEY_FILE"), std::string::npos) << said;
  EXPECT_EQ(said.find("serving"), std::string::npos) << said;
}

TEST(GradlanedKey, AKeyFileOthersCanReadIsRefused) {
  const std::string key = kScratch + ".key";
  write_key(key, 0644);
  const auto [status, said] = refusal("/gradlane-key-test-b", {"--key-file", key});
  EXPECT_EQ(status, 1) << said;
  EXPECT_NE(said.find("mode 0644"), std::string::npos) << said;
  ::unlink(key.c_str());
}

TEST(GradlanedKey, StartsWithAPrivateKeyFileOrWhenToldInsecureWithAWarning) {
  const std::string key = kScratch + ".key";
  write_key(key, 0600);
  {
    ExternalProcess d(gradlaned("/gradlane-key-test-c", {"--key-file", key}), kScratch);
    const std::string said = serve_then_stop(d);
    EXPECT_NE(said.find("serving"), std::string::npos) << said;
    EXPECT_EQ(said.find("warning"), std::string::npos) << said;
  }
  {
    ExternalProcess d(gradlaned("/gradlane-key-test-d", {"--insecure"}), kScratch);
    const std::string said = serve_then_stop(d);
    EXPECT_NE(said.find("serving"), std::string::npos) << said;
    EXPECT_NE(said.find("warning: running without a job key"), std::string::npos) << said;
  }
  ::unlink(key.c_str());
  ::unlink((kScratch + ".out").c_str());
  ::unlink((kScratch + ".err").c_str());
}

}  // namespace
