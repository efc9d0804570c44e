#include "sidecar/daemon/pid_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <string_view>

#include <fmt/format.h>

#include "common/syscall_error.hpp"
#include "gradlane/error.hpp"

namespace gradlane::sidecar {
namespace {

// The pid another gradlaned wrote, or what the file holds instead (it may still be starting).
std::string holder(int fd) {
  char text[32] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string_view s(text, n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  long pid = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), pid);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return "not yet written: it is starting";
  return std::to_string(pid);
}

}  // namespace

PidFile PidFile::acquire(const std::string& path) {
  if (path.empty()) throw Error(Errc::invalid_argument, "--pid-file needs a path");
  // A stale file may be replaced under us by its next owner; loop until the file we lock is the
  // one at `path` (the classic open/flock/stat dance).
  for (;;) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd) detail::throw_call_failed(Errc::system, "opening pid file " + path, errno);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) detail::throw_call_failed(Errc::system, "locking pid file " + path, errno);
      throw Error(Errc::invalid_argument,
                  fmt::format("gradlaned is already running (pid {}, pid file {}): stop it first, or give this one "
                              "another --pid-file",
                              holder(fd.get()), path));
    }
    struct stat locked {};
    struct stat named {};
    if (::fstat(fd.get(), &locked) != 0) detail::throw_call_failed(Errc::system, "fstat of pid file " + path, errno);
    if (::stat(path.c_str(), &named) != 0 || named.st_ino != locked.st_ino || named.st_dev != locked.st_dev) {
      continue;  // removed or replaced between open and flock: lock the current one
    }
    // Ours now. Whatever it holds is a dead daemon's pid: empty it until we are ready.
    if (::ftruncate(fd.get(), 0) != 0) detail::throw_call_failed(Errc::system, "truncating pid file " + path, errno);
    return PidFile(path, std::move(fd));
  }
}

void PidFile::publish(pid_t pid) {
  const std::string text = fmt::format("{}\n", pid);
  if (::ftruncate(fd_.get(), 0) != 0 ||
      ::pwrite(fd_.get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    detail::throw_call_failed(Errc::system, "writing pid file " + path_, errno);
  }
}

PidFile::~PidFile() {
  if (!fd_) return;  // moved from
  // Unlink only the file we hold: a newer owner may have replaced it after an operator
  // removed ours by hand.
  struct stat locked {};
  struct stat named {};
  if (::fstat(fd_.get(), &locked) == 0 && ::stat(path_.c_str(), &named) == 0 && named.st_ino == locked.st_ino &&
      named.st_dev == locked.st_dev) {
    ::unlink(path_.c_str());
  }
  // fd_ closes after this, releasing the lock (after the unlink: no one can lock the old file
  // and then see it vanish).
}

}  // namespace gradlane::sidecar
