// Region descriptors: the 20-byte wire form (encode/decode, anywhere) and the full exchange a
// pair of peers does once per region — advertise on one side, wait_region on the other,
// and back (over rxe: two SENDs and two receive completions).
#include <array>

#include <benchmark/benchmark.h>

#include "loopback.hpp"

namespace gradlane::micro {
namespace {

using namespace std::chrono_literals;

void descriptor_encode(benchmark::State& state) {
  const RegionDescriptor d{0x7f0012345000, 64 << 20, 0x1234};
  std::array<std::byte, RegionDescriptor::kWireSize> wire{};
  for (auto _ : state) {
    d.encode(wire);
    benchmark::DoNotOptimize(wire);
  }
}

void descriptor_decode(benchmark::State& state) {
  std::array<std::byte, RegionDescriptor::kWireSize> wire{};
  RegionDescriptor{0x7f0012345000, 64 << 20, 0x1234}.encode(wire);
  for (auto _ : state) benchmark::DoNotOptimize(RegionDescriptor::decode(wire));
}

// One round trip: a advertises region N, b waits for it and advertises N back, a waits.
void advertise_round_trip(benchmark::State& state, DeviceContext* ctx) {
  Connection& a = ctx->pair.a;
  Connection& b = ctx->pair.b;
  const RegionDescriptor d{0x7f0012345000, 64 << 20, 0x1234};
  // Fresh ids every run: wait_region returns at once for an id it already knows.
  std::uint32_t id = static_cast<std::uint32_t>(state.range(0)) << 24;
  for (auto _ : state) {
    ++id;
    a.advertise(id, d);
    benchmark::DoNotOptimize(b.wait_region(id, 10s));
    b.advertise(id, d);
    benchmark::DoNotOptimize(a.wait_region(id, 10s));
  }
}

}  // namespace

void register_descriptor_benchmarks(DeviceContext* ctx) {
  benchmark::RegisterBenchmark("descriptor/encode", descriptor_encode);
  benchmark::RegisterBenchmark("descriptor/decode", descriptor_decode);
  if (ctx == nullptr) return;
  benchmark::RegisterBenchmark("descriptor/advertise_wait_region_round_trip", advertise_round_trip, ctx)
      ->Arg(1)
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace gradlane::micro
