#include "sidecar/shm/process.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace gradlane::sidecar {

std::optional<std::uint64_t> process_start_time(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // "pid (comm) state ppid ...": comm may contain spaces and ')' so fields are counted from
  // the last ')'. starttime is field 22, i.e. the 20th after the closing parenthesis.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int i = 0; i < 20; ++i) {
    if (!(fields >> field)) return std::nullopt;
  }
  std::uint64_t start = 0;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), start);
  if (ec != std::errc{} || end != field.data() + field.size()) return std::nullopt;
  return start;
}

namespace {

// State letter of /proc/<pid>/stat: a zombie ('Z') or dead ('X') process has exited even though
// its pid and /proc entry linger until its parent reaps it.
bool exited(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return true;
  const char state = text[close + 2];
  return state == 'Z' || state == 'X';
}

}  // namespace

bool process_alive(pid_t pid, std::uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  const auto start = process_start_time(pid);
  return start && *start == start_time && !exited(pid);
}

std::optional<ProcessWatch> ProcessWatch::open(pid_t pid, std::uint64_t start_time) {
  if (pid <= 0) return std::nullopt;
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  // Checked after the pidfd exists: if the start time still matches now, the pidfd was opened
  // on that process (a reused pid would have a later start time).
  if (!process_alive(pid, start_time)) return std::nullopt;
  return ProcessWatch(std::move(pidfd), pid, start_time);
}

bool ProcessWatch::alive() const noexcept {
  if (pidfd_) {
    pollfd p{pidfd_.get(), POLLIN, 0};
    const int n = ::poll(&p, 1, 0);
    return n == 0 || (n < 0 && errno == EINTR);  // readable (n == 1) means it exited
  }
  try {
    return process_alive(pid_, start_time_);
  } catch (...) {
    return true;  // cannot tell (allocation failure): keep the app, look again next sweep
  }
}

}  // namespace gradlane::sidecar
