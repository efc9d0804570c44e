// Memory registration: what the registration cache saves.
//   Cache hit / miss with a fake registrar: the cache's own bookkeeping (runs anywhere).
//   Cache hit / miss on the device: a hit is a map lookup; a miss is ibv_reg_mr +
//   ibv_dereg_mr (the invalidate that makes the next get() miss again).
//   MR registration by size, 4 KiB … 64 MiB: pinning and translation-table cost per byte.
#include <cstring>

#include <benchmark/benchmark.h>

#include "loopback.hpp"

namespace gradlane::micro {
namespace {

struct FakeRegistration {
  void* addr = nullptr;
  std::size_t length = 0;
};

BasicRegistrationCache<FakeRegistration> fake_cache(std::size_t capacity) {
  return BasicRegistrationCache<FakeRegistration>(
      [](void* addr, std::size_t length, Access) {
        return FakeRegistration{addr, length};
      },
      capacity);
}

// range(0) entries already cached; hit the middle one.
void cache_hit_fake(benchmark::State& state) {
  const auto entries = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> arena(entries * 64);
  auto cache = fake_cache(entries + 1);
  for (std::size_t i = 0; i < entries; ++i) cache.get(arena.data() + i * 64, 64, Access::local);
  void* target = arena.data() + (entries / 2) * 64;
  for (auto _ : state) benchmark::DoNotOptimize(&cache.get(target, 64, Access::local));
  state.counters["hits"] = static_cast<double>(cache.stats().hits);
}

void cache_miss_fake(benchmark::State& state) {
  std::vector<std::byte> arena(4096);
  auto cache = fake_cache(16);
  for (auto _ : state) {
    benchmark::DoNotOptimize(&cache.get(arena.data(), arena.size(), Access::local));
    cache.invalidate(arena.data(), arena.size());
  }
}

void cache_hit_device(benchmark::State& state, DeviceContext* ctx) {
  Buffer buffer = Buffer::allocate(static_cast<std::size_t>(state.range(0)));
  RegistrationCache cache(ctx->device);
  cache.get(buffer.data(), buffer.size(), Access::remote_write);
  for (auto _ : state) benchmark::DoNotOptimize(&cache.get(buffer.data(), buffer.size(), Access::remote_write));
}

void cache_miss_device(benchmark::State& state, DeviceContext* ctx) {
  Buffer buffer = Buffer::allocate(static_cast<std::size_t>(state.range(0)));
  std::memset(buffer.data(), 1, buffer.size());  // fault the pages in once, outside the timing
  RegistrationCache cache(ctx->device);
  for (auto _ : state) {
    benchmark::DoNotOptimize(&cache.get(buffer.data(), buffer.size(), Access::remote_write));
    cache.invalidate(buffer.data(), buffer.size());  // ibv_dereg_mr: part of the miss's true cost
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

// ibv_reg_mr alone (the deregistration is paused out of the timing).
void register_by_size(benchmark::State& state, DeviceContext* ctx) {
  Buffer buffer = Buffer::allocate(static_cast<std::size_t>(state.range(0)), Buffer::Pages::small_only);
  std::memset(buffer.data(), 1, buffer.size());
  for (auto _ : state) {
    std::optional<MemoryRegion> mr = MemoryRegion::register_buffer(ctx->device, buffer, Access::remote_write);
    state.PauseTiming();
    mr.reset();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
  state.counters["pages"] = static_cast<double>(buffer.mapped_size() / 4096);
}

}  // namespace

void register_registration_benchmarks(DeviceContext* ctx) {
  benchmark::RegisterBenchmark("registration_cache/hit/fake", cache_hit_fake)->Arg(1)->Arg(64)->Arg(4096);
  benchmark::RegisterBenchmark("registration_cache/miss/fake", cache_miss_fake);
  if (ctx == nullptr) return;
  benchmark::RegisterBenchmark("registration_cache/hit/device", cache_hit_device, ctx)->Arg(4096)->Arg(1 << 20);
  benchmark::RegisterBenchmark("registration_cache/miss/device", cache_miss_device, ctx)->Arg(4096)->Arg(1 << 20);
  benchmark::RegisterBenchmark("register_memory", register_by_size, ctx)
      ->RangeMultiplier(4)
      ->Range(4096, 64 << 20)
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace gradlane::micro
