// Sleeping on a word of shared memory, across processes.
//
// Why a futex and not an eventfd: an eventfd would have to be passed to every application over
// a Unix socket (SCM_RIGHTS) and re-passed on every daemon restart; a futex on an atomic word
// in the segment needs nothing but the mapping. Shared (not FUTEX_PRIVATE_FLAG) futexes are
// keyed by the backing page, so the daemon and the applications meet on the same word even
// though each maps the segment at a different address.
//
// The sleeper side is an eventcount, so a wake-up cannot be lost:
//   sleeper: seen = bell.load(); sleeping = 1; fence; if (work visible) {sleeping = 0; return;}
//            futex_wait(bell, seen, timeout); sleeping = 0;
//   waker:   publish work; fence; if (sleeping) { bell.fetch_add(1); futex_wake(bell); }
// Either the waker sees `sleeping` or the sleeper sees the work (the two fences order the
// store-load pairs), and a bump between `seen` and the wait makes FUTEX_WAIT return at once.
// The waker pays one fence and one load per publish while nobody sleeps: no system call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

namespace gradlane::sidecar::shm {

// Sleeps while `word` == `expected`, at most `timeout`. Returns on a wake, a timeout, a signal,
// or at once if the word already differs. Never throws.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout) noexcept;
// futex_wait over several words at once (futex_waitv, Linux >= 5.16): returns when any of them
// is woken or differs from its expected value, or after `timeout`. At most kMaxWaitWords.
// On a kernel without futex_waitv it sleeps on the first word for at most 1 ms, so the others
// are looked at within that. Never throws.
struct WatchedWord {
  std::atomic<std::uint32_t>* word;
  std::uint32_t expected;
};
inline constexpr std::size_t kMaxWaitWords = 128;  // FUTEX_WAITV_MAX
void futex_wait_any(std::span<const WatchedWord> words, std::chrono::nanoseconds timeout) noexcept;
// Wakes every sleeper on `word` (one per word in gradlane, but waking all is as cheap).
void futex_wake(std::atomic<std::uint32_t>& word) noexcept;

// The waker side of the eventcount: call after publishing, with the sleeper's flag and bell.
inline void ring_bell(std::atomic<std::uint32_t>& sleeping, std::atomic<std::uint32_t>& bell) noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping.load(std::memory_order_relaxed) != 0) {
    bell.fetch_add(1, std::memory_order_release);
    futex_wake(bell);
  }
}

// Back-off while waiting for the peer, before sleeping: pause-spin for the first kPauseSpin
// (the peer is on another core and answers within a cache miss), then yield (the peer may be
// on *this* core — the scheduler's wake-affine placement puts a thread woken by a futex next
// to its waker — and would otherwise not run until this spinner's time slice ends). Measured
// in perf/sidecar: without the yield phase, once either side slept the adaptive round trip
// settled at ~56 us on a busy 2-vCPU host instead of ~1 us.
inline constexpr std::chrono::nanoseconds kPauseSpin = std::chrono::microseconds(20);
void back_off(std::chrono::nanoseconds waited) noexcept;

// A pause for spin loops: frees the sibling hyper-thread and saves power while polling.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace gradlane::sidecar::shm
