#include "sidecar/daemon/job_door.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/syscall_error.hpp"
#include "gradlane/error.hpp"
#include "sidecar/shm/door.hpp"

namespace gradlane::sidecar {
namespace {

// A knock that sends nothing holds the door at most this long.
constexpr std::chrono::milliseconds kKnockLimit{1000};

void send_reply(int socket, const shm::DoorReply& reply, int fd) {
  iovec data{const_cast<shm::DoorReply*>(&reply), sizeof reply};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  if (fd >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  (void)::sendmsg(socket, &message, MSG_NOSIGNAL);  // an app that left meanwhile: nothing to do
}

}  // namespace

JobDoor::JobDoor(const std::string& shm_name, std::map<std::uint32_t, Job> jobs) : jobs_(std::move(jobs)) {
  const shm::DoorAddress door = shm::door_address(shm_name);
  listener_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener_) detail::throw_call_failed(Errc::system, "socket(AF_UNIX) for the door to job segments", errno);
  if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&door.address), door.length) != 0) {
    const int err = errno;
    if (err == EADDRINUSE) {
      throw Error(Errc::invalid_argument,
                  fmt::format("the door to {}'s job segments (abstract socket @gradlane-door{}) is taken: another "
                              "gradlaned serves {}, or some process holds that address; stop it, or start this one "
                              "with a different --shm-name",
                              shm_name, shm_name, shm_name),
                  err);
    }
    detail::throw_call_failed(Errc::system, "bind(the door to " + shm_name + "'s job segments)", err);
  }
  if (::listen(listener_.get(), 64) != 0) detail::throw_call_failed(Errc::system, "listen(door)", errno);
  stop_ = UniqueFd(::eventfd(0, EFD_CLOEXEC));
  if (!stop_) detail::throw_call_failed(Errc::system, "eventfd(door)", errno);
  thread_ = std::thread([this] { serve(); });
}

JobDoor::~JobDoor() {
  const std::uint64_t one = 1;
  if (::write(stop_.get(), &one, sizeof one) != static_cast<ssize_t>(sizeof one)) {
    std::fprintf(stderr, "gradlaned: cannot stop the door's thread: %s\n", std::strerror(errno));
    std::terminate();  // joining would hang; a daemon going down anyway
  }
  thread_.join();
}

void JobDoor::serve() {
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "gradlaned: the door to job segments stops: poll: %s\n", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    UniqueFd knock(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!knock) continue;  // the knocker left already, or out of descriptors for now
    try {
      answer(knock.get());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gradlaned: door to job segments: %s\n", e.what());
    }
  }
}

void JobDoor::answer(int socket) {
  shm::bound_every_call(socket, kKnockLimit);
  shm::DoorRequest request;
  if (::recv(socket, &request, sizeof request, MSG_WAITALL) != static_cast<ssize_t>(sizeof request) ||
      request.magic != shm::kDoorMagic) {
    return;  // not an app of ours: it gets nothing, not even an answer
  }
  const auto asker = shm::peer_uid(socket);
  if (!asker) return;
  shm::DoorReply reply;
  const auto job = jobs_.find(request.job);
  if (job == jobs_.end()) {
    reply.status = shm::DoorStatus::no_own_segment;
    send_reply(socket, reply, -1);
  } else if (*asker != job->second.uid && *asker != 0) {
    reply.status = shm::DoorStatus::not_your_job;
    reply.job_uid = job->second.uid;
    refused_.fetch_add(1, std::memory_order_relaxed);
    send_reply(socket, reply, -1);
  } else {
    reply.status = shm::DoorStatus::granted;
    reply.job_uid = job->second.uid;
    const UniqueFd segment = shm::reopen(job->second.segment.get());  // an open file description of its own
    send_reply(socket, reply, segment.get());
  }
  answered_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace gradlane::sidecar
