// The daemon's signals as something the loop reads, not handlers that set a global flag:
// SIGTERM, SIGINT and SIGHUP are blocked and delivered through a signalfd that run()'s stop
// check polls. SIGTERM/SIGINT stop the daemon; SIGHUP asks it to reopen its schedule log
// (after logrotate moved it).
#pragma once

#include <csignal>
#include <optional>

#include "common/unique_fd.hpp"

namespace gradlane::sidecar {

class DaemonSignals {
 public:
  // Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (create it before starting any
  // thread, which inherits the mask) and opens the signalfd. Throws Error(system) on failure.
  DaemonSignals();
  DaemonSignals(const DaemonSignals&) = delete;
  DaemonSignals& operator=(const DaemonSignals&) = delete;
  ~DaemonSignals();  // restores the previous mask

  // The first shutdown signal (SIGTERM or SIGINT) received so far, without waiting.
  std::optional<int> received() noexcept;
  // Whether a SIGHUP came since the last call, without waiting.
  bool take_hangup() noexcept;

 private:
  void drain() noexcept;

  sigset_t previous_{};
  UniqueFd fd_;
  std::optional<int> received_;
  bool hangup_ = false;
};

}  // namespace gradlane::sidecar
