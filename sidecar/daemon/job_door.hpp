// gradlaned's side of the door to jobs' own segments (sidecar/shm/door.hpp): a thread that
// answers each knock with the job's segment, if the kernel says the one knocking is the job's
// user or root, and with whose job it is otherwise. It reads only what it was given at start
// (the jobs, their users, a descriptor of each segment), never the daemon's loop state.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <thread>

#include "common/unique_fd.hpp"
#include "sidecar/shm/segment.hpp"

namespace gradlane::sidecar {

class JobDoor {
 public:
  struct Job {
    std::uint32_t uid = 0;
    UniqueFd segment;  // the door's own descriptor of the job's segment (Segment::reopen())
  };
  // Binds the door of the daemon serving `shm_name` and starts answering. Throws
  // Error(invalid_argument) when the address is taken (another gradlaned serves that name, or a
  // squatter holds it: say so, since apps would refuse a squatter's door anyway).
  JobDoor(const std::string& shm_name, std::map<std::uint32_t, Job> jobs);
  ~JobDoor();  // stops the thread: no knock is answered afterwards
  JobDoor(const JobDoor&) = delete;
  JobDoor& operator=(const JobDoor&) = delete;

  // Knocks answered so far, and those refused for another user's job (for tests and stats).
  std::uint64_t answered() const noexcept { return answered_.load(std::memory_order_relaxed); }
  std::uint64_t refused() const noexcept { return refused_.load(std::memory_order_relaxed); }

 private:
  void serve();
  void answer(int socket);

  std::map<std::uint32_t, Job> jobs_;
  UniqueFd listener_;
  UniqueFd stop_;  // an eventfd: written once by the destructor
  std::atomic<std::uint64_t> answered_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::thread thread_;  // last: starts once everything above is in place
};

}  // namespace gradlane::sidecar
