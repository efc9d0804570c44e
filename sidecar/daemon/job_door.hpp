// gradlaned's side of the door to jobs' own segments (sidecar/shm/door.hpp): a thread that
// answers each knock with the job's segment, if the kernel says the one knocking is the job's
// user or root, and with whose job it is otherwise. It reads only what it was given at start
// (the jobs, their users, a descriptor of each segment), never the daemon's loop state.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

#include "common/unique_fd.hpp"
#include "sidecar/shm/door.hpp"
#include "sidecar/shm/segment.hpp"

namespace gradlane::sidecar {

class JobDoor {
 public:
  struct Job {
    std::uint32_t uid = 0;
    UniqueFd segment;  // the door's own descriptor of the job's segment (Segment::reopen())
  };
  // Binds the door of the daemon serving `shm_name` (removing a socket of this user's that a
  // dead gradlaned left) and starts answering. Throws Error(invalid_argument) when the path is
  // taken (another gradlaned serves that name, or a squatter holds it: say so, since apps would
  // refuse a squatter's door anyway). The destructor removes the socket file.
  JobDoor(const std::string& shm_name, std::map<std::uint32_t, Job> jobs);
  ~JobDoor();  // stops the thread: no knock is answered afterwards
  JobDoor(const JobDoor&) = delete;
  JobDoor& operator=(const JobDoor&) = delete;

 private:
  // A knock whose request has not come yet: it is dropped at its deadline, and no knock waits
  // for another (a silent knocker cannot hold the door).
  struct Knock {
    UniqueFd socket;
    std::chrono::steady_clock::time_point deadline;
  };
  void take_path(const std::string& shm_name);
  void serve();
  void take_knocks();
  void answer(int socket);

  std::map<std::uint32_t, Job> jobs_;
  shm::DoorAddress door_;
  ino_t inode_ = 0;  // our socket file, removed by the destructor if it is still there
  dev_t device_ = 0;
  UniqueFd listener_;
  UniqueFd stop_;              // an eventfd: written once by the destructor
  std::vector<Knock> knocks_;  // the thread's alone
  std::thread thread_;         // last: starts once everything above is in place
};

}  // namespace gradlane::sidecar
