// The steady clock's now in nanoseconds since its epoch: on Linux CLOCK_MONOTONIC, the clock of
// gradlaned's schedule log and of the timestamps the ps roles and clients put beside it.
#pragma once

#include <chrono>
#include <cstdint>

namespace gradlane {

inline std::int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace gradlane
