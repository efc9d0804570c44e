#include "common/ticks.hpp"

#include <thread>

namespace gradlane::perf {

double TickRate::ticks_per_usec(std::chrono::milliseconds min_span) const {
  using std::chrono::steady_clock;
  const auto spent = steady_clock::now() - wall0_;
  if (spent < min_span) std::this_thread::sleep_for(min_span - spent);
  const Ticks t1 = now_ticks();
  const auto w1 = steady_clock::now();
  const double usec = std::chrono::duration<double, std::micro>(w1 - wall0_).count();
  return static_cast<double>(t1 - ticks0_) / usec;
}

double TickRate::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0_).count();
}

}  // namespace gradlane::perf
