// A tool under test as a child process: posix_spawn with stdout and stderr captured to files.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "../common/external_process.hpp"

namespace gradlane::perf_testing {

class ToolProcess {
 public:
  // Starts `exe args...`; stdout goes to `<log>.out`, stderr to `<log>.err`.
  ToolProcess(const std::string& exe, const std::vector<std::string>& args, const std::string& log);
  ToolProcess(const ToolProcess&) = delete;
  ToolProcess& operator=(const ToolProcess&) = delete;
  ~ToolProcess();  // kills a child still running at once (ExternalProcess then reaps it)

  // Exit code, or nullopt when it did not exit within `timeout` (it is then killed) or died
  // of a signal.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  std::string out() const;
  std::string err() const;

 private:
  std::string log_;
  gradlane::testing::ExternalProcess process_;
};

// A fresh directory for one test's files: under GRADLANE_OUT_DIR when set (the VM's results
// share, kept for inspection), else under /tmp.
std::string scratch_dir(const std::string& name);

}  // namespace gradlane::perf_testing
