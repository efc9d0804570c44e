#include "sidecar/shm/segment.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <chrono>
#include <thread>
#include <utility>

#include "common/syscall_error.hpp"
#include "gradlane/error.hpp"

namespace gradlane::sidecar::shm {
namespace {

// A lock held by someone else may be an application probing it (LOCK_SH for a microsecond),
// not a daemon: look a few times before concluding that a daemon owns the segment.
constexpr auto kLockProbeFor = std::chrono::milliseconds(300);
constexpr auto kLockProbeEvery = std::chrono::milliseconds(10);

void* map(int fd, std::size_t bytes, const std::string& name) {
  // MAP_POPULATE: fault the (small) segment in now, not on the first request of a hot path.
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    detail::throw_call_failed(Errc::system, "mmap(" + name + ", " + std::to_string(bytes) + " bytes)", errno);
  }
  return base;
}

bool same_file(int fd_a, int fd_b) {
  struct stat a {
  }, b{};
  return ::fstat(fd_a, &a) == 0 && ::fstat(fd_b, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Removes `name` if it still refers to the file open as `fd`.
void unlink_if_same(const std::string& name, int fd) {
  UniqueFd current(::shm_open(name.c_str(), O_RDONLY, 0));
  if (current && same_file(current.get(), fd)) ::shm_unlink(name.c_str());
}

}  // namespace

void check_shm_name(const std::string& name, const char* what) {
  if (name.size() < 2 || name.size() > 255 || name.front() != '/' || name.find('/', 1) != std::string::npos) {
    throw Error(Errc::invalid_argument,
                std::string(what) + " '" + name +
                    "' is not a shared-memory name: use '/name' (no other '/', at most 255 characters)");
  }
}

std::string job_segment_name(const std::string& shared, std::uint32_t job) {
  return shared + ".job" + std::to_string(job);
}

Segment Segment::create(const std::string& name, std::size_t bytes) {
  check_shm_name(name, "--shm-name");
  const auto give_up = std::chrono::steady_clock::now() + kLockProbeFor;
  for (;;) {
    UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
    if (fd) {
      // Locked before it has a size, so an opener that sees a size sees a locked segment.
      // (A concurrent daemon could lock it between our open and this flock; then we lose.)
      if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;
      if (::fchmod(fd.get(), 0600) != 0 || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
        const int err = errno;
        ::shm_unlink(name.c_str());
        detail::throw_call_failed(Errc::system, "sizing shared memory " + name, err);
      }
      void* base = map(fd.get(), bytes, name);
      return Segment(name, std::move(fd), base, bytes, true);
    }
    if (errno != EEXIST) detail::throw_call_failed(Errc::system, "shm_open(" + name + ", O_CREAT)", errno);

    UniqueFd old(::shm_open(name.c_str(), O_RDWR, 0));
    if (!old) {
      if (errno == ENOENT) continue;  // it went away in between: try creating again
      throw Error(Errc::invalid_argument,
                  "shared memory " + name + " exists and cannot be opened (" + std::strerror(errno) +
                      "): another user's gradlaned? pick another --shm-name",
                  errno);
    }
    if (::flock(old.get(), LOCK_EX | LOCK_NB) == 0) {
      unlink_if_same(name, old.get());  // stale: its daemon died without cleaning up
      continue;
    }
    if (std::chrono::steady_clock::now() >= give_up) {
      throw Error(Errc::invalid_argument, "another gradlaned already serves " + name +
                                              " (it holds the segment's lock): stop it first, or start this one with a "
                                              "different --shm-name");
    }
    std::this_thread::sleep_for(kLockProbeEvery);
  }
}

std::optional<Segment> Segment::open(const std::string& name) {
  UniqueFd fd(::shm_open(name.c_str(), O_RDWR, 0));
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    const int err = errno;
    throw Error(Errc::sidecar_unavailable,
                "cannot open the gradlaned segment " + name + ": " + std::strerror(err) +
                    (err == EACCES ? " (it belongs to another user: run gradlaned as this user, "
                                     "with its own --shm-name)"
                                   : ""),
                err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) detail::throw_call_failed(Errc::system, "fstat(" + name + ")", errno);
  if (st.st_size <= 0) return std::nullopt;  // being created right now
  const auto bytes = static_cast<std::size_t>(st.st_size);
  void* base = map(fd.get(), bytes, name);
  return Segment(name, std::move(fd), base, bytes, false);
}

namespace {
constexpr int kResizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;
// Whether the file open as `fd` is sealed against shrinking and growing.
bool resize_sealed(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & kResizeSeals) == kResizeSeals;
}
}  // namespace

Segment Segment::create_sealed(const std::string& label, std::size_t bytes) {
  UniqueFd fd(::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) detail::throw_call_failed(Errc::system, "memfd_create(" + label + ")", errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) detail::throw_call_failed(Errc::system, "flock(" + label + ")", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    detail::throw_call_failed(Errc::system, "sizing shared memory " + label, errno);
  }
  // F_SEAL_SEAL too: nobody may lift or add a seal afterwards.
  if (::fcntl(fd.get(), F_ADD_SEALS, kResizeSeals | F_SEAL_SEAL) != 0) {
    detail::throw_call_failed(Errc::system, "sealing shared memory " + label, errno);
  }
  void* base = map(fd.get(), bytes, label);
  return Segment(label, std::move(fd), base, bytes, false);
}

Segment Segment::adopt(UniqueFd fd, const std::string& label) {
  if (!resize_sealed(fd.get())) {
    throw Error(Errc::protocol,
                "the segment handed over as " + label + " is not sealed against resizing: not one gradlaned made");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) detail::throw_call_failed(Errc::system, "fstat(" + label + ")", errno);
  const auto bytes = static_cast<std::size_t>(st.st_size);
  void* base = map(fd.get(), bytes, label);
  return Segment(label, std::move(fd), base, bytes, false);
}

std::optional<Segment> Segment::open_sealed(const std::string& path, const std::string& label) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) detail::throw_call_failed(Errc::system, "opening " + path, errno);
  if (!resize_sealed(fd.get())) return std::nullopt;
  return adopt(std::move(fd), label);
}

UniqueFd reopen(int fd) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  UniqueFd again(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!again) detail::throw_call_failed(Errc::system, "reopening shared memory " + path, errno);
  return again;
}

Segment::Segment(std::string name, UniqueFd fd, void* base, std::size_t bytes, bool owns_name) noexcept
    : name_(std::move(name)), fd_(std::move(fd)), base_(base), bytes_(bytes), owns_name_(owns_name) {}

Segment::Segment(Segment&& other) noexcept
    : name_(std::move(other.name_)),
      fd_(std::move(other.fd_)),
      base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      owns_name_(std::exchange(other.owns_name_, false)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    fd_ = std::move(other.fd_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    owns_name_ = std::exchange(other.owns_name_, false);
  }
  return *this;
}

Segment::~Segment() { release(); }

void Segment::release() noexcept {
  if (owns_name_) unlink();
  owns_name_ = false;
  if (base_ != nullptr) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
  fd_.reset();
}

std::optional<std::uint32_t> Segment::owner_uid() const noexcept {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) return std::nullopt;
  return static_cast<std::uint32_t>(st.st_uid);
}

bool Segment::locked_by_daemon() const noexcept {
  if (::flock(fd_.get(), LOCK_SH | LOCK_NB) == 0) {
    ::flock(fd_.get(), LOCK_UN);
    return false;
  }
  return errno == EWOULDBLOCK;
}

void Segment::unlink() noexcept {
  if (fd_) unlink_if_same(name_, fd_.get());
}

}  // namespace gradlane::sidecar::shm
