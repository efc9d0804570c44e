#include "sidecar/daemon/job_door.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/syscall_error.hpp"
#include "gradlane/error.hpp"
#include "sidecar/shm/door.hpp"

namespace gradlane::sidecar {
namespace {

// How long a knock may take to say which job it wants: a request is 8 bytes, sent at once.
constexpr std::chrono::milliseconds kKnockLimit{1000};
// Knocks waiting for their request at most; the oldest is dropped for a new one beyond.
constexpr std::size_t kMaxKnocks = 256;
// After accept4 failed for want of descriptors or memory, before trying again (poll would
// report the queued connection again at once: a busy loop).
constexpr std::chrono::milliseconds kAcceptBackOff{50};

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
  // Non-blocking: a reply of 12 bytes fits any socket buffer; an app that left gets nothing.
  (void)::sendmsg(socket, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

JobDoor::JobDoor(const std::string& shm_name, std::map<std::uint32_t, Job> jobs)
    : jobs_(std::move(jobs)), door_(shm::door_address(shm_name)) {
  // Non-blocking: take_knocks() accepts until none is left.
  listener_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener_) detail::throw_call_failed(Errc::system, "socket(AF_UNIX) for the door to job segments", errno);
  take_path(shm_name);
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
  // Our socket file, unless someone replaced it meanwhile (then it is theirs to remove).
  struct stat st {};
  if (::lstat(door_.path(), &st) == 0 && st.st_ino == inode_ && st.st_dev == device_) ::unlink(door_.path());
}

void JobDoor::take_path(const std::string& shm_name) {
  const auto taken = [&](const char* by) {
    return Error(Errc::invalid_argument,
                 fmt::format("the door to {}'s job segments ({}) is taken {}: stop it, or start this gradlaned "
                             "with a different --shm-name",
                             shm_name, door_.path(), by));
  };
  const auto* address = reinterpret_cast<const sockaddr*>(&door_.address);
  for (int attempt = 0;; ++attempt) {
    if (::bind(listener_.get(), address, door_.length) == 0) break;
    if (errno != EADDRINUSE || attempt == 1) {
      detail::throw_call_failed(Errc::system,
                                fmt::format("bind({}, the door to {}'s job segments)", door_.path(), shm_name), errno);
    }
    // Something is there. A door that answers is another gradlaned's (or a squatter's), and a
    // file that is not a socket, or (unless we are root) another user's, is not ours to
    // remove; a socket nobody answers on was left by a gradlaned that died.
    struct stat st {};
    if (::lstat(door_.path(), &st) != 0) continue;  // gone meanwhile
    if (!S_ISSOCK(st.st_mode)) throw taken("by a file that is not a socket");
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe && ::connect(probe.get(), address, door_.length) == 0) {
      throw taken("by a running process: another gradlaned serves that name, or some process holds its door");
    }
    if (st.st_uid != ::geteuid() && ::geteuid() != 0) throw taken(fmt::format("by uid {}'s socket", st.st_uid).c_str());
    if (::unlink(door_.path()) != 0 && errno != ENOENT) {
      detail::throw_call_failed(Errc::system,
                                fmt::format("unlink({}, a door left by a gradlaned that died)", door_.path()), errno);
    }
  }
  // Any user may knock (the door asks the kernel who it is); remember which file is ours.
  struct stat st {};
  if (::chmod(door_.path(), 0666) != 0 || ::lstat(door_.path(), &st) != 0) {
    const int err = errno;
    ::unlink(door_.path());
    detail::throw_call_failed(Errc::system, fmt::format("chmod({}, 0666)", door_.path()), err);
  }
  inode_ = st.st_ino;
  device_ = st.st_dev;
}

void JobDoor::serve() {
  for (;;) {
    // Knocks past their deadline go; then one poll over the listener, the stop event and
    // every knock still waiting for its request.
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(knocks_, [&](const Knock& k) { return k.deadline <= now; });
    std::vector<pollfd> fds{{listener_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    int timeout_ms = -1;
    for (const Knock& k : knocks_) {
      fds.push_back({k.socket.get(), POLLIN, 0});
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(k.deadline - now).count();
      timeout_ms = timeout_ms < 0 ? static_cast<int>(left) : std::min(timeout_ms, static_cast<int>(left));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "gradlaned: the door to job segments stops: poll: %s\n", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    // Knocks whose request came (or that hung up) are answered and closed; the others wait on.
    std::vector<Knock> waiting;
    for (std::size_t i = 0; i < knocks_.size(); ++i) {
      if (fds[2 + i].revents == 0) {
        waiting.push_back(std::move(knocks_[i]));
        continue;
      }
      try {
        answer(knocks_[i].socket.get());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gradlaned: door to job segments: %s\n", e.what());
      }
    }
    knocks_ = std::move(waiting);
    if (fds[0].revents & POLLIN) take_knocks();
  }
}

void JobDoor::take_knocks() {
  for (;;) {
    UniqueFd knock(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!knock) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::fprintf(stderr, "gradlaned: door to job segments: accept: %s; trying again in %lld ms\n",
                     std::strerror(errno), static_cast<long long>(kAcceptBackOff.count()));
        std::this_thread::sleep_for(kAcceptBackOff);
      }
      return;  // EAGAIN: none left; or the knocker left already
    }
    // Anyone may knock, and is told whose job it is: a knock that says nothing goes at its
    // deadline, and a flood of them evicts the oldest (whose app knocks again).
    if (knocks_.size() >= kMaxKnocks) knocks_.erase(knocks_.begin());
    knocks_.push_back({std::move(knock), std::chrono::steady_clock::now() + kKnockLimit});
  }
}

void JobDoor::answer(int socket) {
  shm::DoorRequest request;
  if (::recv(socket, &request, sizeof request, MSG_DONTWAIT) != static_cast<ssize_t>(sizeof request) ||
      request.magic != shm::kDoorMagic) {
    return;  // not an app of ours (or it hung up): it gets nothing, not even an answer
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
    send_reply(socket, reply, -1);
  } else {
    reply.status = shm::DoorStatus::granted;
    reply.job_uid = job->second.uid;
    const UniqueFd segment = shm::reopen(job->second.segment.get());  // an open file description of its own
    send_reply(socket, reply, segment.get());
  }
}

}  // namespace gradlane::sidecar
