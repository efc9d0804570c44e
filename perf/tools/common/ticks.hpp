// Timestamps for the measured loops, read the way perftest reads them.
//
// perftest stamps every post and completion with the CPU's time-stamp counter (get_cycles()).
// We do the same rather than call steady_clock: inside the Soft-RoCE VM the clocksource is
// HPET and clock_gettime costs about 1.35 µs per call (rdtsc: 0.02 µs), which would add a
// visible error to a 10 µs latency sample. Unlike perftest we do not guess the TSC rate from
// /proc/cpuinfo or a short sampling loop (its "r^2 < 0.9 ... Can't produce a report" failure
// under TCG): TickRate measures ticks against steady_clock across the whole run, two clock
// reads in total.
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace gradlane::perf {

using Ticks = std::uint64_t;

inline Ticks now_ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<Ticks>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

// Ticks per microsecond, calibrated over the interval between construction and rate().
class TickRate {
 public:
  TickRate() : ticks0_(now_ticks()), wall0_(std::chrono::steady_clock::now()) {}
  // Calibrates over at least `min_span` (sleeps for the rest), so short runs stay accurate.
  double ticks_per_usec(std::chrono::milliseconds min_span = std::chrono::milliseconds(50)) const;
  // Seconds of wall time since construction.
  double elapsed_seconds() const;

 private:
  Ticks ticks0_;
  std::chrono::steady_clock::time_point wall0_;
};

}  // namespace gradlane::perf
