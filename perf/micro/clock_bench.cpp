// The clocks the data path reads. Under the Soft-RoCE VM the clocksource is HPET, where one
// steady_clock::now() is a trapped MMIO read: this benchmark puts a number on it (and on the
// TSC the perf tools read instead), because Connection's post() and every bounded wait read
// steady_clock.
#include <chrono>

#include <benchmark/benchmark.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "loopback.hpp"

namespace gradlane::micro {
namespace {

void steady_clock_now(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}

#if defined(__x86_64__) || defined(__i386__)
void rdtsc(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(__rdtsc());
}
#endif

}  // namespace

void register_clock_benchmarks(DeviceContext*) {
  benchmark::RegisterBenchmark("clock/steady_clock_now", steady_clock_now);
#if defined(__x86_64__) || defined(__i386__)
  benchmark::RegisterBenchmark("clock/rdtsc", rdtsc);
#endif
}

}  // namespace gradlane::micro
