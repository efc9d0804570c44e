#include "sidecar/daemon/signals.hpp"

#include <pthread.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>

#include "common/syscall_error.hpp"

namespace gradlane::sidecar {

ShutdownSignals::ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  if (const int err = ::pthread_sigmask(SIG_BLOCK, &set, &previous_); err != 0) {
    detail::throw_call_failed(Errc::system, "pthread_sigmask(SIGTERM, SIGINT)", err);
  }
  fd_ = UniqueFd(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!fd_) {
    const int err = errno;
    ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
    detail::throw_call_failed(Errc::system, "signalfd(SIGTERM, SIGINT)", err);
  }
}

ShutdownSignals::~ShutdownSignals() { ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

std::optional<int> ShutdownSignals::received() noexcept {
  signalfd_siginfo info{};
  while (!received_ && ::read(fd_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    received_ = static_cast<int>(info.ssi_signo);
  }
  return received_;
}

}  // namespace gradlane::sidecar
