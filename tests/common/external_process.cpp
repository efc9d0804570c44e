#include "external_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <string_view>
#include <thread>

extern char** environ;

namespace gradlane::testing {

using namespace std::chrono_literals;

namespace {

bool is_key_setting(std::string_view entry) {
  return entry.starts_with("GRADLANE_JOB_KEY=") || entry.starts_with("GRADLANE_JOB_KEY_FILE=") ||
         entry.starts_with("GRADLANE_INSECURE=");
}

}  // namespace

// The suites test protocols, failures and schedules, with keyless in-process peers
// (TransportOptions{}); the children they start take the same stance explicitly. The tests of
// authentication give their children a key, or unset this, themselves.
std::vector<char*> ExternalProcess::child_environment() {
  environment_.clear();
  bool keyed = false;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    environment_.emplace_back(*entry);
    keyed = keyed || is_key_setting(*entry);
  }
  if (!keyed) environment_.emplace_back("GRADLANE_INSECURE=1");
  std::vector<char*> pointers;
  for (auto& e : environment_) pointers.push_back(e.data());
  pointers.push_back(nullptr);
  return pointers;
}

ExternalProcess::ExternalProcess(const std::vector<std::string>& argv_strings, const std::string& output_prefix) {
  std::vector<std::string> argv_storage = argv_strings;
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!output_prefix.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (output_prefix + ".out").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (output_prefix + ".err").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), child_environment().data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn(" + argv_storage[0] + ") failed: " + std::strerror(rc));
}

ExternalProcess::~ExternalProcess() {
  if (!reaped_) {
    if (!wait_exit(5s)) {
      kill_hard();
      (void)wait_exit(5s);
    }
  }
}

void ExternalProcess::kill_hard() {
  if (!reaped_) ::kill(pid_, SIGKILL);
}

std::optional<int> ExternalProcess::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status;
    }
    if (r < 0) {
      reaped_ = true;
      return std::nullopt;
    }
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(10ms);
  }
}

}  // namespace gradlane::testing
