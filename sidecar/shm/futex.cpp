#include "sidecar/shm/futex.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sched.h>

#include <climits>
#include <ctime>

namespace gradlane::sidecar::shm {
namespace {

// std::atomic<uint32_t> is a plain 32-bit word (static_assert'ed lock-free in layout.hpp);
// the futex syscall wants its address.
std::uint32_t* word_address(std::atomic<std::uint32_t>& word) noexcept {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  return reinterpret_cast<std::uint32_t*>(&word);
}

}  // namespace

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) noexcept {
  if (timeout <= std::chrono::nanoseconds::zero()) return;
  timespec relative{};
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  // Errors (EAGAIN: the word changed; EINTR; ETIMEDOUT) all mean "go and look again".
  ::syscall(SYS_futex, word_address(word), FUTEX_WAIT, expected, &relative, nullptr, 0);
}

void back_off(std::chrono::nanoseconds waited) noexcept {
  if (waited < kPauseSpin) {
    cpu_relax();
  } else {
    ::sched_yield();
  }
}

void futex_wake(std::atomic<std::uint32_t>& word) noexcept {
  ::syscall(SYS_futex, word_address(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace gradlane::sidecar::shm
