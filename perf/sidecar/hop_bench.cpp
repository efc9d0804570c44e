// gradlane_sidecar_bench: what one request costs to get its grant, app -> sidecar -> app.
//
//   BM_RawSpscRoundTrip       the floor: two in-process boost::lockfree::spsc_queue (64-byte
//                             entries), the echo thread busy-polling — a hop with no sidecar.
//   BM_SidecarRoundTrip/...   Client::request -> gradlaned loop (on another thread, real shm
//                             segment, PassThroughPolicy) -> Client::wait. Variants by how the
//                             two sides wait (see the Args): busy (daemon never sleeps),
//                             adaptive (the defaults: daemon spins 200 us, client 50 us, then
//                             futex), futex (both sleep at once), and after 1 ms of idle (both
//                             asleep when the request comes: the futex wake-up path).
//   BM_SidecarRoundTripScheduler  the same through the real scheduling core, for reference.
//   BM_*SingleThread          one thread does both sides: the software cost of a hop without
//                             the cache-line transfers between cores.
//   BM_DaemonIdleCpu/...      CPU the daemon thread uses while no app sends anything.
//
// Counters: median_ns / p99_ns per round trip (timed one by one with steady_clock, whose
// ~25 ns read is inside every sample, raw and sidecar alike); idle_cpu_percent.
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <boost/lockfree/spsc_queue.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gradlane/sidecar.hpp"
#include "sidecar/daemon/daemon.hpp"
#include "sidecar/shm/layout.hpp"

namespace {

using namespace std::chrono_literals;
using gradlane::sidecar::AttachOptions;
using gradlane::sidecar::Client;
using gradlane::sidecar::Daemon;
using gradlane::sidecar::DaemonConfig;
using gradlane::sidecar::Grant;
using gradlane::sidecar::Update;
using Clock = std::chrono::steady_clock;

void report(benchmark::State& state, std::vector<std::int64_t>& samples) {
  if (samples.empty()) return;
  std::sort(samples.begin(), samples.end());
  state.counters["median_ns"] = static_cast<double>(samples[samples.size() / 2]);
  state.counters["p99_ns"] = static_cast<double>(samples[samples.size() * 99 / 100]);
}

std::string bench_shm_name() {
  static std::atomic<int> n{0};
  return "/gradlane-bench-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// gradlaned's loop on a thread of this process, serving a fresh segment.
class DaemonThread {
 public:
  DaemonThread(std::chrono::nanoseconds idle_spin, std::unique_ptr<gradlane::sched::Policy> policy) {
    DaemonConfig config;
    config.shm_name = bench_shm_name();
    config.max_apps = 4;
    config.idle_spin = idle_spin;
    daemon_ = std::make_unique<Daemon>(config, std::move(policy));
    thread_ = std::thread([this] {
      const double cpu0 = thread_cpu_seconds();
      daemon_->run([this] { return stop_.load(std::memory_order_relaxed); });
      cpu_seconds_ = thread_cpu_seconds() - cpu0;
    });
  }
  ~DaemonThread() { stop(); }
  // Stops the loop; returns the CPU seconds the daemon thread used.
  double stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return cpu_seconds_;
  }
  const std::string& shm_name() const { return daemon_->config().shm_name; }

 private:
  std::unique_ptr<Daemon> daemon_;
  std::atomic<bool> stop_{false};
  double cpu_seconds_ = 0;
  std::thread thread_;
};

AttachOptions attach_options(const std::string& name, std::chrono::microseconds spin) {
  AttachOptions o;
  o.shm_name = name;
  o.job = 1;
  o.endpoint = 1;
  o.region_bytes = 1 << 20;
  o.spin = spin;
  return o;
}

constexpr Update kUpdate{.tensor = 1,
                         .receiver = 2,
                         .bytes = 4096,
                         .region_offset = 0,
                         .computed_on = 0,
                         .gradient_norm = 1.0F,
                         .priority = 0};

// ---- the floor ----

void BM_RawSpscRoundTrip(benchmark::State& state) {
  using Queue = boost::lockfree::spsc_queue<gradlane::sidecar::shm::AppEntry, boost::lockfree::capacity<256>>;
  auto to_echo = std::make_unique<Queue>();
  auto back = std::make_unique<Queue>();
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    gradlane::sidecar::shm::AppEntry e{};
    while (!stop.load(std::memory_order_relaxed)) {
      if (to_echo->pop(e)) {
        while (!back->push(e)) {
        }
      }
    }
  });
  std::vector<std::int64_t> samples;
  samples.reserve(1 << 20);
  gradlane::sidecar::shm::AppEntry e{};
  for (auto _ : state) {
    const auto t0 = Clock::now();
    e.request++;
    while (!to_echo->push(e)) {
    }
    while (!back->pop(e)) {
    }
    samples.push_back((Clock::now() - t0).count());
  }
  stop.store(true);
  echo.join();
  report(state, samples);
}
BENCHMARK(BM_RawSpscRoundTrip)->MinTime(2.0)->UseRealTime();

// ---- through the sidecar ----

// Args: {daemon idle spin in us (-1: never sleeps), client spin in us, idle gap before each
// request in us}. The gap is longer than the spins, so both sides are asleep when it ends.
void sidecar_round_trips(benchmark::State& state, std::unique_ptr<gradlane::sched::Policy> policy) {
  const auto daemon_spin =
      state.range(0) < 0 ? std::chrono::nanoseconds(1h) : std::chrono::microseconds(state.range(0));
  const auto client_spin = std::chrono::microseconds(state.range(1));
  const auto gap = std::chrono::microseconds(state.range(2));
  DaemonThread daemon(daemon_spin, std::move(policy));
  Client client = Client::attach(attach_options(daemon.shm_name(), client_spin));
  std::vector<std::int64_t> samples;
  samples.reserve(1 << 20);
  Update update = kUpdate;
  for (auto _ : state) {
    if (gap.count() > 0) {
      state.PauseTiming();
      std::this_thread::sleep_for(gap);
      state.ResumeTiming();
    }
    const auto t0 = Clock::now();
    const std::uint64_t id = client.request(update);
    const Grant g = client.wait(1s);
    samples.push_back((Clock::now() - t0).count());
    if (g.request != id || g.kind != gradlane::sidecar::GrantKind::go) {
      const std::string what = "unexpected answer: " + std::string(gradlane::sidecar::kind_name(g.kind)) + "/" +
                               std::string(gradlane::sidecar::reason_name(g.reason)) + " for request " +
                               std::to_string(g.request) + " (expected " + std::to_string(id) + ")";
      state.SkipWithError(what.c_str());
      break;
    }
    update.computed_on = g.sequence;         // as if the app pulled the model after each update
    client.complete(id, g.part_index, 1us);  // keeps the daemon's bookkeeping bounded
  }
  report(state, samples);
}

void BM_SidecarRoundTrip(benchmark::State& state) {
  sidecar_round_trips(state, std::make_unique<gradlane::sched::PassThroughPolicy>());
}
void BM_SidecarRoundTripScheduler(benchmark::State& state) {
  gradlane::sched::SchedulerConfig config;
  config.replica_bound = std::nullopt;
  sidecar_round_trips(state, std::make_unique<gradlane::sched::SchedulerPolicy>(config));
}
BENCHMARK(BM_SidecarRoundTrip)
    ->ArgNames({"daemon_spin_us", "client_spin_us", "gap_us"})
    ->Args({-1, 50, 0})   // busy: the daemon never sleeps
    ->Args({200, 50, 0})  // adaptive (the defaults), back to back
    ->Args({0, 0, 0})     // futex: both sides sleep at once
    ->MinTime(2.0)
    ->UseRealTime();
BENCHMARK(BM_SidecarRoundTrip)
    ->ArgNames({"daemon_spin_us", "client_spin_us", "gap_us"})
    ->Args({200, 50, 1000})  // adaptive after 1 ms idle: the futex wake-up path
    ->Args({-1, 50, 1000})   // the same with a busy daemon (isolates the daemon's wake-up)
    ->Iterations(1000)
    ->UseRealTime();
BENCHMARK(BM_SidecarRoundTripScheduler)
    ->ArgNames({"daemon_spin_us", "client_spin_us", "gap_us"})
    ->Args({200, 50, 0})
    ->MinTime(2.0)
    ->UseRealTime();

// ---- software cost, one thread ----

void BM_RawSpscSingleThread(benchmark::State& state) {
  using Queue = boost::lockfree::spsc_queue<gradlane::sidecar::shm::AppEntry, boost::lockfree::capacity<256>>;
  auto a = std::make_unique<Queue>();
  auto b = std::make_unique<Queue>();
  gradlane::sidecar::shm::AppEntry e{};
  for (auto _ : state) {
    e.request++;
    a->push(e);
    a->pop(e);
    b->push(e);
    b->pop(e);
    benchmark::DoNotOptimize(e);
  }
}
BENCHMARK(BM_RawSpscSingleThread);

void BM_SidecarSingleThread(benchmark::State& state) {
  DaemonConfig config;
  config.shm_name = bench_shm_name();
  config.max_apps = 4;
  auto daemon = std::make_unique<Daemon>(config, std::make_unique<gradlane::sched::PassThroughPolicy>());
  // Attach needs the daemon to answer: step it from a helper thread until attached.
  std::atomic<bool> attached{false};
  std::thread helper([&] {
    while (!attached.load()) daemon->step(Daemon::clock_now());
  });
  Client client = Client::attach(attach_options(config.shm_name, 0us));
  attached.store(true);
  helper.join();
  const gradlane::sched::Instant now = Daemon::clock_now();
  for (auto _ : state) {
    const std::uint64_t id = client.request(kUpdate);
    daemon->step(now);
    const auto g = client.poll();
    client.complete(id, g->part_index, 1us);
    daemon->step(now);  // takes the completion
  }
}
BENCHMARK(BM_SidecarSingleThread);

// ---- idle ----

void BM_DaemonIdleCpu(benchmark::State& state) {
  const auto spin = std::chrono::microseconds(state.range(0));
  double cpu = 0;
  double wall = 0;
  for (auto _ : state) {
    DaemonThread daemon(spin, std::make_unique<gradlane::sched::PassThroughPolicy>());
    {
      // One app attached and idle, as in a training job between iterations.
      Client client = Client::attach(attach_options(daemon.shm_name(), 50us));
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(1s);
      wall += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    cpu += daemon.stop();
  }
  state.counters["idle_cpu_percent"] = 100.0 * cpu / wall;
}
// 200 us: the default idle spin; 3600 s: busy polling (never sleeps).
BENCHMARK(BM_DaemonIdleCpu)->Arg(200)->Arg(3'600'000'000)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
