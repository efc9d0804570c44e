#include "sidecar/shm/door.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "common/syscall_error.hpp"
#include "gradlane/error.hpp"

namespace gradlane::sidecar::shm {
namespace {

constexpr char kDoorPrefix[] = "/dev/shm/gradlane-door.";

// Bounds every send and receive on `socket` by `timeout` (SO_SNDTIMEO / SO_RCVTIMEO).
void bound_every_call(int socket, std::chrono::milliseconds timeout) {
  const auto ms = std::max<std::int64_t>(timeout.count(), 1);
  const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  if (::setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    detail::throw_call_failed(Errc::system, "setsockopt(gradlaned door, SO_RCVTIMEO/SO_SNDTIMEO)", errno);
  }
}

}  // namespace

DoorAddress door_address(const std::string& shm_name) {
  DoorAddress a;
  a.address.sun_family = AF_UNIX;
  // A POSIX shm name is "/name" with no other slash: the door is a file beside the segment.
  const std::string bare = shm_name.starts_with('/') ? shm_name.substr(1) : shm_name;
  const std::string path = std::string(kDoorPrefix) + bare;
  if (path.size() + 1 > sizeof a.address.sun_path) {
    throw Error(Errc::invalid_argument,
                fmt::format("shared-memory name {} is too long for gradlaned's door to job segments (at most {} "
                            "characters with --job-user): choose a shorter --shm-name",
                            shm_name, sizeof a.address.sun_path - sizeof kDoorPrefix));
  }
  path.copy(a.address.sun_path, path.size());
  a.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

std::optional<std::uint32_t> peer_uid(int socket) {
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0 || length != sizeof cred) return std::nullopt;
  return static_cast<std::uint32_t>(cred.uid);
}

bool trusted_maker(std::uint32_t uid) { return uid == 0 || uid == ::geteuid(); }

namespace {

DoorAnswer no_answer(std::string problem) {
  DoorAnswer answer;
  answer.kind = DoorAnswer::Kind::no_answer;
  answer.problem = std::move(problem);
  return answer;
}

// Errors a later knock may not meet: a signal, a door busy or restarting.
bool transient(int err) { return err == EINTR || err == EAGAIN || err == ECONNRESET || err == EPIPE; }

}  // namespace

DoorAnswer ask_door(const std::string& shm_name, std::uint32_t job, std::chrono::milliseconds timeout) {
  DoorAddress door;
  try {
    door = door_address(shm_name);
  } catch (const Error&) {
    return {};  // a name too long for a door: gradlaned refuses --job-user with it, so no door
  }
  UniqueFd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket) detail::throw_call_failed(Errc::system, "socket(AF_UNIX) for gradlaned's door", errno);
  bound_every_call(socket.get(), timeout);
  // Anyone may create a socket at that path first: only root's door, or our own user's, hands
  // out a segment we would trust with our requests.
  const auto untrusted = [&](std::optional<std::uint32_t> holder) {
    return Error(Errc::sidecar_unavailable,
                 fmt::format("the door to {}'s job segments ({}) is held by uid {}, neither this process's (uid {}) "
                             "nor root's: not a gradlaned this app can trust (another user's, or a squatter); pick "
                             "the segment gradlaned serves (GRADLANE_SIDECAR_SHM)",
                             shm_name, door.path(), holder ? std::to_string(*holder) : "?", ::geteuid()));
  };
  if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&door.address), door.length) != 0) {
    if (errno == ECONNREFUSED || errno == ENOENT) return {};  // no door: no daemon with job segments
    if (transient(errno)) return no_answer(fmt::format("its door is busy ({})", std::strerror(errno)));
    if (errno == EACCES) {  // gradlaned's door is open to every user (0666): this one is not
      struct stat st {};
      const bool known = ::lstat(door.path(), &st) == 0;
      if (!known || !trusted_maker(st.st_uid))
        throw untrusted(known ? std::optional<std::uint32_t>(st.st_uid) : std::nullopt);
      throw Error(Errc::sidecar_unavailable,
                  fmt::format("the door to {}'s job segments ({}, uid {}, mode {:o}) does not let this user knock: "
                              "gradlaned's is mode 666; is it a gradlaned of another release?",
                              shm_name, door.path(), st.st_uid, st.st_mode & 07777));
    }
    detail::throw_call_failed(Errc::sidecar_unavailable, "connect(gradlaned's door for " + shm_name + ")", errno);
  }
  const auto holder = peer_uid(socket.get());
  if (!holder || !trusted_maker(*holder)) throw untrusted(holder);
  const DoorRequest request{kDoorMagic, job};
  if (::send(socket.get(), &request, sizeof request, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof request)) {
    if (transient(errno)) return no_answer(fmt::format("its door did not take the request ({})", std::strerror(errno)));
    detail::throw_call_failed(Errc::sidecar_unavailable, "asking gradlaned's door for job " + std::to_string(job),
                              errno);
  }

  DoorReply reply;
  iovec data{&reply, sizeof reply};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  const ssize_t got = ::recvmsg(socket.get(), &message, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  DoorAnswer answer;
  // Every descriptor that came is owned (and closed) here, whatever the reply says.
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      UniqueFd owned(fd);
      if (!answer.segment) answer.segment = std::move(owned);
    }
  }
  if (got < 0) {
    if (transient(errno)) {
      return no_answer(fmt::format("its door did not answer within {} ms ({})", timeout.count(), std::strerror(errno)));
    }
    detail::throw_call_failed(Errc::sidecar_unavailable, "reading the answer of gradlaned's door", errno);
  }
  if (got == 0) return no_answer("its door closed without an answer (a gradlaned stopping?)");
  if (got != static_cast<ssize_t>(sizeof reply) || reply.magic != kDoorMagic || (message.msg_flags & MSG_CTRUNC)) {
    throw Error(Errc::protocol,
                fmt::format("gradlaned's door for {} answered {} bytes that are not a door reply", shm_name, got));
  }
  answer.job_uid = reply.job_uid;
  switch (reply.status) {
    case DoorStatus::granted:
      if (!answer.segment) {
        throw Error(Errc::protocol, "gradlaned's door granted job " + std::to_string(job) + "'s segment but sent none");
      }
      answer.kind = DoorAnswer::Kind::granted;
      return answer;
    case DoorStatus::no_own_segment:
      answer.kind = DoorAnswer::Kind::no_own_segment;
      break;
    case DoorStatus::not_your_job:
      answer.kind = DoorAnswer::Kind::not_your_job;
      break;
    default:
      throw Error(Errc::protocol,
                  fmt::format("gradlaned's door answered status {}", static_cast<std::uint32_t>(reply.status)));
  }
  answer.segment.reset();
  return answer;
}

}  // namespace gradlane::sidecar::shm
