// Waiting for a granted slot (sidecar mode), shared by the worker and the aggregator.
#pragma once

#include <chrono>
#include <thread>

namespace gradlane::ps {

// Returns at slot start (steady_clock nanoseconds, as the sidecar grants it), not before: the
// previous slot's transfer owns the link until then. Sleeps through most of the wait, since
// the processes of a job share few cores, and spins the last 200 us, which a sleep overshoots.
inline void wait_for_slot(std::chrono::nanoseconds slot_start_ns) {
  const auto slot_start = std::chrono::steady_clock::time_point(slot_start_ns);
  if (const auto ahead = slot_start - std::chrono::steady_clock::now(); ahead > std::chrono::microseconds(300)) {
    std::this_thread::sleep_for(ahead - std::chrono::microseconds(200));
  }
  while (std::chrono::steady_clock::now() < slot_start) {
  }
}

}  // namespace gradlane::ps
