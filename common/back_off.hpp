// How a wait gives its core away: spin, then yield, then nap. Shared by every wait of the
// data path (data_path.cpp poll_until) and the ps worker's wait for a grant.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace gradlane::detail {

// Spinning answers fastest; past kSpinFor the waiter yields, past kYieldFor it naps a
// sixteenth of the time waited (at most kLongestNap). Sleeps start at 1 ms waited, where a
// sixteenth (62 us) is about the kernel's timer slack. With more waiting threads than cores,
// pure spinning starved the threads, and rxe's softirq work, that were to answer
// (perf/results/sidecar-load.md: 32 ps workers on 2 vCPUs, 0.15 of one worker's rate).
inline constexpr std::chrono::microseconds kSpinFor{50};
inline constexpr std::chrono::microseconds kYieldFor{1000};
inline constexpr std::chrono::microseconds kLongestNap{1000};

// One step of the back-off after `waited` without what the caller waits for; whether it napped.
inline bool back_off(std::chrono::steady_clock::duration waited) {
  if (waited < kSpinFor) return false;
  if (waited < kYieldFor) {
    std::this_thread::yield();
    return false;
  }
  std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(waited / 16, kLongestNap));
  return true;
}

}  // namespace gradlane::detail
