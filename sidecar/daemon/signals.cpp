#include "sidecar/daemon/signals.hpp"

#include <pthread.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>

#include "common/syscall_error.hpp"

namespace gradlane::sidecar {

DaemonSignals::DaemonSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  if (const int err = ::pthread_sigmask(SIG_BLOCK, &set, &previous_); err != 0) {
    detail::throw_call_failed(Errc::system, "pthread_sigmask(SIGTERM, SIGINT, SIGHUP)", err);
  }
  fd_ = UniqueFd(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!fd_) {
    const int err = errno;
    ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
    detail::throw_call_failed(Errc::system, "signalfd(SIGTERM, SIGINT, SIGHUP)", err);
  }
}

DaemonSignals::~DaemonSignals() { ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

void DaemonSignals::drain() noexcept {
  signalfd_siginfo info{};
  while (::read(fd_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    if (info.ssi_signo == SIGHUP) {
      hangup_ = true;
    } else if (!received_) {
      received_ = static_cast<int>(info.ssi_signo);
    }
  }
}

std::optional<int> DaemonSignals::received() noexcept {
  drain();
  return received_;
}

bool DaemonSignals::take_hangup() noexcept {
  drain();
  const bool hangup = hangup_;
  hangup_ = false;
  return hangup;
}

}  // namespace gradlane::sidecar
