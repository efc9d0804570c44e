// The parameter server's kernels against memcpy of the same 4 MiB. Every kernel is memory
// bound, so memcpy is the ceiling to compare with. bytes_per_second counts bytes *read* per
// second (memcpy: 4 MiB; sgd_step: model + gradient, 8 MiB; sum_in_order: k × 4 MiB);
// `traffic` counts bytes read + written, for a like-for-like look at the memory system.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "ps/protocol/model_version.hpp"
#include "ps/receiving/kernels.hpp"

namespace {

constexpr std::size_t kBytes = 4 << 20;
constexpr std::size_t kFloats = kBytes / sizeof(float);

// Page-aligned like the registered buffers the kernels run on, and touched before timing.
struct Floats {
  std::unique_ptr<float, decltype(&std::free)> memory{static_cast<float*>(std::aligned_alloc(4096, kBytes)),
                                                      &std::free};
  explicit Floats(float value) {
    std::span<float> s = span();
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = value + static_cast<float>(i % 1024) * 1e-3F;
  }
  std::span<float> span() const { return {memory.get(), kFloats}; }
};

void report(benchmark::State& state, std::size_t read, std::size_t written) {
  const auto iterations = static_cast<std::int64_t>(state.iterations());
  state.SetBytesProcessed(iterations * static_cast<std::int64_t>(read));
  state.counters["traffic"] = benchmark::Counter(static_cast<double>(iterations) * static_cast<double>(read + written),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

void BM_memcpy(benchmark::State& state) {
  Floats from(1.0F), to(0.0F);
  for (auto _ : state) {
    std::memcpy(to.span().data(), from.span().data(), kBytes);
    benchmark::DoNotOptimize(to.span().data());
    benchmark::ClobberMemory();
  }
  report(state, kBytes, kBytes);
}
BENCHMARK(BM_memcpy);

// memcpy of k × 4 MiB: the baseline with the same memory footprint as sum_in_order of k
// parts. 4 MiB copies stay in a large last-level cache; 64 MiB do not.
void BM_memcpy_footprint(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * kBytes;
  std::vector<char> from(bytes, 1), to(bytes, 2);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::ClobberMemory();
  }
  report(state, bytes, bytes);
}
BENCHMARK(BM_memcpy_footprint)->ArgName("k")->Arg(4)->Arg(16);

void BM_sgd_step(benchmark::State& state) {
  Floats model(1.0F), gradient(0.5F);
  for (auto _ : state) {
    gradlane::ps::sgd_step(model.span(), gradient.span(), 1e-9F);  // tiny: the model stays finite
    benchmark::ClobberMemory();
  }
  report(state, 2 * kBytes, kBytes);
}
BENCHMARK(BM_sgd_step);

// What every publish of a shard adds to its apply, and every pull to the worker: the checksum
// that makes a pull consistent whatever order the NIC serves its READs in (model_version.hpp).
void BM_payload_checksum(benchmark::State& state) {
  Floats model(1.0F);
  std::uint64_t version = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(gradlane::ps::payload_checksum(model.span(), version += 2));
  }
  report(state, kBytes, 0);
}
BENCHMARK(BM_payload_checksum);

void BM_sum_in_order(benchmark::State& state) {
  const auto k = static_cast<std::size_t>(state.range(0));
  std::vector<Floats> parts;
  parts.reserve(k);
  for (std::size_t j = 0; j < k; ++j) parts.emplace_back(static_cast<float>(j));
  std::vector<std::span<const float>> inputs;
  for (const Floats& p : parts) inputs.push_back(p.span());
  Floats out(0.0F);
  for (auto _ : state) {
    gradlane::ps::sum_in_order(out.span(), inputs);
    benchmark::ClobberMemory();
  }
  report(state, k * kBytes, kBytes);
}
BENCHMARK(BM_sum_in_order)->ArgName("k")->Arg(2)->Arg(4)->Arg(8)->Arg(16);

}  // namespace

BENCHMARK_MAIN();
