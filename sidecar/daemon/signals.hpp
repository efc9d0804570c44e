// SIGTERM / SIGINT as something the loop reads, not a handler that sets a global flag: the
// signals are blocked and delivered through a signalfd that run()'s stop check polls.
#pragma once

#include <csignal>
#include <optional>

#include "common/unique_fd.hpp"

namespace gradlane::sidecar {

class ShutdownSignals {
 public:
  // Blocks SIGTERM and SIGINT in the calling thread (create it before starting any thread,
  // which inherits the mask) and opens the signalfd. Throws Error(system) on failure.
  ShutdownSignals();
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;
  ~ShutdownSignals();  // restores the previous mask

  // The first shutdown signal received so far, without waiting.
  std::optional<int> received() noexcept;

 private:
  sigset_t previous_{};
  UniqueFd fd_;
  std::optional<int> received_;
};

}  // namespace gradlane::sidecar
