#include "tool_process.hpp"

#include "../common/text_file.hpp"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

namespace gradlane::perf_testing {

using gradlane::testing::read_text_file;

namespace {
std::vector<std::string> command_line(const std::string& exe, const std::vector<std::string>& args) {
  std::vector<std::string> argv{exe};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}
}  // namespace

ToolProcess::ToolProcess(const std::string& exe, const std::vector<std::string>& args, const std::string& log)
    : log_(log), process_(command_line(exe, args), log) {}

ToolProcess::~ToolProcess() { process_.kill_hard(); }

std::optional<int> ToolProcess::wait(std::chrono::milliseconds timeout) {
  const auto status = process_.wait_exit(timeout);
  if (!status) {
    process_.kill_hard();
    (void)process_.wait_exit(std::chrono::seconds(5));
    return std::nullopt;
  }
  if (WIFEXITED(*status)) return WEXITSTATUS(*status);
  return std::nullopt;
}

std::string ToolProcess::out() const { return read_text_file(log_ + ".out"); }
std::string ToolProcess::err() const { return read_text_file(log_ + ".err"); }

std::string scratch_dir(const std::string& name) {
  const char* base = std::getenv("GRADLANE_OUT_DIR");
  std::string dir =
      std::string(base && *base ? base : "/tmp") + "/perf-smoke-" + name + "-" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

}  // namespace gradlane::perf_testing
