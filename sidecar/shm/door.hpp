// The door to a job's own segment (gradlaned --job-user JOB:USER).
//
// gradlaned keeps such a segment in a sealed memfd, not under a name in /dev/shm:
//   - no name, so nobody can squat it or open it by guessing;
//   - F_SEAL_SHRINK | F_SEAL_GROW, so no process holding it can ftruncate it under the daemon,
//     whose next access past the new end would die of SIGBUS and take every job's sidecar along.
// An app gets the segment through this door, a Unix socket at a path in /dev/shm that asks the
// kernel who is knocking (SO_PEERCRED): the job's user, or root, gets a descriptor of the
// segment (SCM_RIGHTS); anyone else gets told whose job it is. The app checks the door the same
// way, since anyone may create a socket there first: it takes a segment only from root or
// itself. A path, not an abstract name: abstract names belong to a network namespace, and an
// app in a container that shares the host's /dev/shm (its IPC) but not its network would find
// no door.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/unique_fd.hpp"

namespace gradlane::sidecar::shm {

// The address of the door of the daemon serving `shm_name` ("/name"): the socket
// "/dev/shm/gradlane-door.name", beside the shared segment. Throws Error(invalid_argument)
// when the name does not fit a socket address.
struct DoorAddress {
  sockaddr_un address{};
  socklen_t length = 0;
  const char* path() const { return address.sun_path; }
};
DoorAddress door_address(const std::string& shm_name);

// The uid of the process at the other end of Unix socket `socket` (SO_PEERCRED), as the kernel
// recorded it at connect() / listen(); nullopt if it cannot be read.
std::optional<std::uint32_t> peer_uid(int socket);

inline constexpr std::uint32_t kDoorMagic = 0x726f6467;  // "gdor"

// What an app sends: the job whose segment it wants.
struct DoorRequest {
  std::uint32_t magic = kDoorMagic;
  std::uint32_t job = 0;
};

enum class DoorStatus : std::uint32_t {
  granted = 0,         // the segment's descriptor comes with the reply
  no_own_segment = 1,  // the job shares the daemon's segment (no --job-user for it)
  not_your_job = 2,    // the job's segment belongs to job_uid, and the asker is neither it nor root
};

// What the daemon answers.
struct DoorReply {
  std::uint32_t magic = kDoorMagic;
  DoorStatus status = DoorStatus::no_own_segment;
  std::uint32_t job_uid = 0;
};

// Whether this process may trust what a process of `uid` made or serves (a segment, a door):
// root's, or its own user's.
bool trusted_maker(std::uint32_t uid);

// App side: what the door said.
struct DoorAnswer {
  // no_door: nothing listens there (no daemon, or one without job segments, or a name too
  // long for a door); no_answer: the door did not answer this time (interrupted, reset, full,
  // slow; `problem` says which): ask again.
  enum class Kind { no_door, no_answer, no_own_segment, not_your_job, granted };
  Kind kind = Kind::no_door;
  std::uint32_t job_uid = 0;  // not_your_job: the job's user
  UniqueFd segment;           // granted: the job's segment
  std::string problem;        // no_answer: why
};

// Asks the door of the daemon serving `shm_name` for job `job`'s segment; every step is bounded
// by `timeout`. Throws Error(sidecar_unavailable) when the door is held by a process of neither
// root nor this user (a squatter: it could hand out a forged segment), Error(protocol) on an
// answer that is not a door's.
DoorAnswer ask_door(const std::string& shm_name, std::uint32_t job, std::chrono::milliseconds timeout);

}  // namespace gradlane::sidecar::shm
