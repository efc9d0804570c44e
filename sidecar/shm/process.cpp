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
#include <vector>

namespace gradlane::sidecar {

namespace {

// The fields of /proc/<pid>/stat after "pid (comm)", from field 3 (state) on: comm may contain
// spaces and ')' so they are counted from the last ')'. Empty if the process is gone.
std::vector<std::string> stat_fields(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return {};
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream in(text.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string field; in >> field;) fields.push_back(std::move(field));
  return fields;
}

// Field `number` (1-based, as proc(5) counts) as a number.
std::optional<std::uint64_t> stat_number(const std::vector<std::string>& fields, std::size_t number) {
  if (number < 3 || fields.size() < number - 2) return std::nullopt;
  const std::string& field = fields[number - 3];
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec != std::errc{} || end != field.data() + field.size()) return std::nullopt;
  return value;
}

// A zombie ('Z') or dead ('X') process has exited even though its pid and /proc entry linger
// until its parent reaps it.
bool exited(const std::vector<std::string>& fields) { return fields.empty() || fields[0] == "Z" || fields[0] == "X"; }

constexpr std::uint64_t kPfExiting = 0x4;  // PF_EXITING in the flags (field 9)

}  // namespace

std::optional<std::uint64_t> process_start_time(pid_t pid) { return stat_number(stat_fields(pid), 22); }

bool process_exiting(pid_t pid) {
  const auto fields = stat_fields(pid);
  const auto flags = stat_number(fields, 9);
  return exited(fields) || !flags || (*flags & kPfExiting) != 0;
}

bool process_alive(pid_t pid, std::uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  const auto fields = stat_fields(pid);
  const auto start = stat_number(fields, 22);
  return start && *start == start_time && !exited(fields);
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

bool ProcessWatch::exiting() const noexcept {
  try {
    return !alive() || process_exiting(pid_);
  } catch (...) {
    return false;  // cannot tell (allocation failure): as alive() says
  }
}

}  // namespace gradlane::sidecar
