#include "sidecar/shm/futex.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sched.h>

#include <algorithm>
#include <array>
#include <cerrno>
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

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout) noexcept {
  if (timeout <= std::chrono::nanoseconds::zero()) return;
  timespec relative{};
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  // Errors (EAGAIN: the word changed; EINTR; ETIMEDOUT) all mean "go and look again".
  ::syscall(SYS_futex, word_address(word), FUTEX_WAIT, expected, &relative, nullptr, 0);
}

void futex_wait_any(std::span<const WatchedWord> words, std::chrono::nanoseconds timeout) noexcept {
  if (words.empty() || timeout <= std::chrono::nanoseconds::zero()) return;
  if (words.size() == 1) return futex_wait(*words[0].word, words[0].expected, timeout);
  std::array<futex_waitv, kMaxWaitWords> waiters{};
  const std::size_t n = std::min(words.size(), kMaxWaitWords);
  for (std::size_t i = 0; i < n; ++i) {
    waiters[i].val = words[i].expected;
    waiters[i].uaddr = reinterpret_cast<std::uintptr_t>(word_address(*words[i].word));
    waiters[i].flags = FUTEX_32;  // shared: the words are in memory other processes map
  }
  // futex_waitv takes an absolute deadline on the clock it is given.
  timespec deadline{};
  ::clock_gettime(CLOCK_MONOTONIC, &deadline);
  const std::int64_t at = deadline.tv_sec * 1'000'000'000LL + deadline.tv_nsec + timeout.count();
  deadline.tv_sec = static_cast<time_t>(at / 1'000'000'000);
  deadline.tv_nsec = static_cast<long>(at % 1'000'000'000);
#ifdef SYS_futex_waitv
  if (::syscall(SYS_futex_waitv, waiters.data(), static_cast<unsigned>(n), 0U, &deadline, CLOCK_MONOTONIC) >= 0 ||
      errno == EAGAIN || errno == ETIMEDOUT || errno == EINTR) {
    return;  // woken, a word changed, the time is up, or a signal: all mean "go and look again"
  }
#endif
  // No futex_waitv (ENOSYS: an older kernel; EPERM: a seccomp filter that does not know it):
  // sleep on the first word, briefly, so the others are looked at within a millisecond —
  // never return at once, or an idle daemon would spin.
  futex_wait(*words[0].word, words[0].expected,
             std::min<std::chrono::nanoseconds>(timeout, std::chrono::milliseconds(1)));
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
