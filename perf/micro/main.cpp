// gradlane_micro_bench: registration cache hit/miss, MR registration by size, descriptor
// exchange, post+poll per write, and the clock reads the data path makes.
//
//   gradlane_micro_bench                          native benchmarks (no device)
//   ci/softroce.sh -- gradlane_micro_bench        everything, over rxe
#include <iostream>

#include <benchmark/benchmark.h>

#include "loopback.hpp"

int main(int argc, char** argv) {
  using namespace gradlane::micro;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  std::string why_not;
  std::optional<gradlane::Device> device = benchmark_device(why_not);
  std::optional<Loopback> pair;
  if (device) {
    try {
      pair.emplace(Loopback::open(*device));
    } catch (const gradlane::Error& e) {
      why_not = e.what();
    }
  }
  std::optional<DeviceContext> context;
  if (device && pair) context.emplace(DeviceContext{*device, *pair});
  if (!context) std::cerr << "gradlane_micro_bench: device benchmarks skipped: " << why_not << '\n';

  DeviceContext* ctx = context ? &*context : nullptr;
  register_clock_benchmarks(ctx);
  register_registration_benchmarks(ctx);
  register_descriptor_benchmarks(ctx);
  if (ctx) register_data_path_benchmarks(*ctx);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
