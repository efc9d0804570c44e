// A child process for tests: started with posix_spawn, killed and reaped (bounded) when it goes
// out of scope, so a failing test never leaves processes behind or hangs on one.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace gradlane::testing {

// A child process, killed and reaped (bounded) when it goes out of scope.
class ExternalProcess {
 public:
  // argv[0] is the executable's path. With an `output_prefix`, the child's stdin is /dev/null
  // and its stdout/stderr go to `<output_prefix>.out` / `.err`; otherwise it inherits ours.
  explicit ExternalProcess(const std::vector<std::string>& argv, const std::string& output_prefix = {});
  ExternalProcess(const ExternalProcess&) = delete;
  ExternalProcess& operator=(const ExternalProcess&) = delete;
  ~ExternalProcess();

  pid_t pid() const { return pid_; }
  bool reaped() const { return reaped_; }
  // SIGKILL, unless the child was already reaped (its pid may belong to someone else by now).
  void kill_hard();
  // Exit status as from waitpid, or nullopt if it did not exit within `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);

 private:
  // The test's environment, with GRADLANE_INSECURE=1 unless it sets a key or that already.
  std::vector<char*> child_environment();

  std::vector<std::string> environment_;  // what child_environment() points into
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace gradlane::testing
