// Test harness for the sidecar: unique segment names, a daemon stepped by a background thread
// that a test can hold still, and child processes (this test binary in a --child role) for
// the cases where a real process must die.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gradlane/sidecar.hpp"
#include "sidecar/daemon/daemon.hpp"

namespace gradlane::sidecar::test {

// "/gradlane-test-<pid>-<n>": never the user's real sidecar, never shared between tests.
std::string unique_shm_name();

DaemonConfig test_config(const std::string& shm_name);
AttachOptions test_attach(const std::string& shm_name, std::uint32_t job = 1);
Update small_update(std::uint32_t tensor = 1);
// The scheduler's defaults without a replica window (a server app's slots alone bound it).
sched::SchedulerConfig no_replica();
class DaemonDriver;
class Child;
// Waits for `count` grants to `app`, each a go, completes each at once, and returns their
// sequences; throws (naming what came instead) for anything but a go.
std::vector<std::uint64_t> take_and_complete(Client& app, std::size_t count);
// Kills `sender` (an "app-granted" child holding a granted transfer) and steps the daemon until
// it has reclaimed the dead app and scheduled again: the sequence's Cancel is emitted.
void kill_granted_sender(DaemonDriver& driver, Child& sender);

// A Daemon whose step() runs on a background thread. hold() stops the thread between steps
// and lets the test call step() itself (deterministic interleavings); release by destroying it.
class DaemonDriver {
 public:
  explicit DaemonDriver(DaemonConfig config, std::unique_ptr<sched::Policy> policy = nullptr);
  ~DaemonDriver();
  DaemonDriver(const DaemonDriver&) = delete;
  DaemonDriver& operator=(const DaemonDriver&) = delete;

  [[nodiscard]] std::unique_lock<std::mutex> hold() { return std::unique_lock<std::mutex>(mutex_); }
  // Only while holding.
  Daemon& daemon() { return *daemon_; }
  std::size_t step() { return daemon_->step(Daemon::clock_now()); }
  // Not while holding: a copy of the counters / the attached count, read under the lock the
  // stepping thread takes (ThreadSanitizer found tests reading them while the thread wrote).
  DaemonStats stats() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return daemon_->stats();
  }
  std::size_t attached_apps() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return daemon_->attached_apps();
  }
  // Not while holding: waits until the daemon's SchedulerPolicy holds no credit for NIC
  // `endpoint` (every granted transfer's completion reached it); false after `timeout`.
  bool credit_returned(std::uint32_t endpoint, std::chrono::milliseconds timeout);
  // Steps at a time past every housekeeping deadline (forces heartbeat + liveness sweep).
  std::size_t step_far_ahead();
  // Stops the thread for good; the daemon stays up and the test steps it by hand.
  void pause();
  // Stops the thread and destroys the daemon (segment marked stopped and unlinked).
  void stop();

 private:
  std::mutex mutex_;
  std::unique_ptr<Daemon> daemon_;
  std::atomic<bool> quit_{false};
  std::thread thread_;
  std::chrono::nanoseconds skew_{0};
};

// A child process running this test binary with `--child=<role>` and extra arguments. It gets a
// pipe on fd 3; ready() waits until it writes a byte there (its "I am set up" signal); and a
// pipe on fd 4 on which go() lets it proceed, for roles that must wait for the test.
class Child {
 public:
  Child(const std::string& role, const std::vector<std::string>& args);
  ~Child();  // SIGKILLs and reaps it if still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool ready(std::chrono::milliseconds timeout);
  void go();
  void kill_now();  // SIGKILL and reap
  int terminate();  // SIGTERM, reap, and return the exit status (a daemon child stops cleanly)
  // Waits for it to exit by itself and reaps it: its exit status, or -1 after `timeout`.
  int wait_exit(std::chrono::milliseconds timeout);
  pid_t pid() const noexcept { return pid_; }

 private:
  pid_t pid_ = -1;
  int ready_fd_ = -1;
  int go_fd_ = -1;
  bool reaped_ = false;
};

// The child side; returns the exit code. Called by main() for `--child=...`.
int run_child(int argc, char** argv);

}  // namespace gradlane::sidecar::test
