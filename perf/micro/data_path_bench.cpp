// The data path's cost per write, over rxe between the two ends of a loopback pair.
//   post_poll/automatic: unsignalled writes (one in signal_interval signalled), polled when
//     64 are in flight — the library's intended steady state, cost per write.
//   post_poll/signalled_wait: post one signalled write and poll until it completes — the
//     per-message floor (post, completion, poll) with nothing overlapped.
//   poll/empty: one poll() of an idle connection (the progress engine's idle cost,
//     including the rdma_cm event check every 256th empty poll).
#include <benchmark/benchmark.h>

#include "loopback.hpp"

namespace gradlane::micro {
namespace {

using namespace std::chrono_literals;

struct Target {
  Buffer src, dst;
  MemoryRegion src_mr, dst_mr;
  explicit Target(const Device& device, std::size_t bytes)
      : src(Buffer::allocate(bytes)),
        dst(Buffer::allocate(bytes)),
        src_mr(MemoryRegion::register_buffer(device, src, Access::local)),
        dst_mr(MemoryRegion::register_buffer(device, dst, Access::remote_write)) {}
};

void drain(Connection& c) {
  while (c.outstanding() > 0) c.poll();
}

void post_poll_automatic(benchmark::State& state, DeviceContext* ctx) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  Target t(ctx->device, bytes);
  Connection& c = ctx->pair.a;
  const RegionDescriptor remote = t.dst_mr.descriptor();
  for (auto _ : state) {
    c.write(t.src_mr, 0, remote, 0, bytes);
    while (c.outstanding() >= 64) c.poll();
  }
  // Leave the connection idle: a final signalled write lets every earlier one be reaped.
  c.write(t.src_mr, 0, remote, 0, bytes, Signal::always);
  drain(c);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void post_poll_signalled_wait(benchmark::State& state, DeviceContext* ctx) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  Target t(ctx->device, bytes);
  Connection& c = ctx->pair.a;
  const RegionDescriptor remote = t.dst_mr.descriptor();
  for (auto _ : state) {
    c.write(t.src_mr, 0, remote, 0, bytes, Signal::always);
    drain(c);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void poll_empty(benchmark::State& state, DeviceContext* ctx) {
  Connection& c = ctx->pair.b;
  for (auto _ : state) benchmark::DoNotOptimize(c.poll());
}

}  // namespace

void register_data_path_benchmarks(DeviceContext& ctx) {
  benchmark::RegisterBenchmark("post_poll/automatic", post_poll_automatic, &ctx)
      ->Arg(8)
      ->Arg(4096)
      ->Arg(65536)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("post_poll/signalled_wait", post_poll_signalled_wait, &ctx)
      ->Arg(8)
      ->Arg(4096)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("poll/empty", poll_empty, &ctx);
}

}  // namespace gradlane::micro
