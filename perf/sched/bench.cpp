// gradlane_sched_bench: the cost of one scheduling decision of the core (Google Benchmark).
//
// What a "decision" is: one Outcome produced by Scheduler::schedule() — a Grant, a Redirect,
// a Drop or an AggregateGrant. Each decision picks, among every pending candidate, the
// transfer that can finish first, after the staleness, replica-window, credit and
// reservation checks, and books its slot.
//
// Steady state, as the daemon runs it: 1,000 workers each have exactly one request pending
// for one server at the start of every schedule() call (a worker whose request was decided
// submits its next one, computed on the current version, before the next call), and the grant
// horizon is 0, so a call decides only what can start now: typically one grant (plus any
// drops or a group of redirects it triggers). Time is advanced to the server's next free
// moment between calls and every granted transfer is completed (measured = its slot length)
// before the next call. The timed loop therefore includes those submit() and complete() calls:
// ns/decision is the whole per-decision cost, not just the scan.
//
// The Packed variants run the same with IngressSharing::packed: the server's ingress carries
// as many grants at once as their shares fit (here 2 to 4 workers' rates per 12.5 GB/s of
// server), and time advances to the next end of a booking instead of the book's tail.
//
// Reported counters: "ns_per_decision" (the target: <= 10,000 ns) and decisions per call.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <variant>
#include <vector>

#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched {
namespace {

constexpr std::uint32_t kServer = 1'000'000;
constexpr Bytes kUpdate = Bytes{1} << 20;  // 1 MiB: one part

enum class Mode { sjf, fifo, mlfabric };

SchedulerConfig config_for(Mode mode, IngressSharing ingress) {
  SchedulerConfig c;
  c.ingress = ingress;
  c.grant_horizon = Nanos{0};
  c.bandwidth.default_bytes_per_sec = 12.5e9;
  c.replica_bound = 64;
  switch (mode) {
    case Mode::sjf:  // ordering only: nothing is ever dropped or grouped
      c.staleness_bound = std::nullopt;
      c.aggregation.enabled = false;
      break;
    case Mode::fifo:
      c.ordering = Ordering::fifo;
      c.staleness_bound = std::nullopt;
      c.aggregation.enabled = false;
      break;
    case Mode::mlfabric:  // everything on: tau, aggregation with every worker an aggregator
      c.staleness_bound = 64;
      break;
  }
  return c;
}

struct Bench {
  Bench(Mode mode, IngressSharing ingress, std::uint32_t workers) : s(config_for(mode, ingress)) {
    for (std::uint32_t w = 0; w < workers; ++w) {
      // Spread link speeds so the SJF order is not just request-id order.
      s.set_rate(EndpointId{w}, Direction::egress, (5 + w % 8) * 1.25e9);
      if (mode == Mode::mlfabric) s.add_aggregator(JobId{1}, EndpointId{w});
      submit(w);
    }
  }

  void submit(std::uint32_t worker) {
    Request r;
    r.id = RequestId{next_id++};
    r.job = JobId{1};
    r.sender = EndpointId{worker};
    r.receiver = EndpointId{kServer};
    r.tensor = TensorId{1};
    r.bytes = kUpdate;
    r.computed_on = s.server_version(EndpointId{kServer});
    r.gradient_norm = static_cast<double>(next_id % 7);
    if (s.submit(r, now) != SubmitStatus::accepted) std::abort();
  }

  // One schedule() call plus the submits and completions that keep the state steady.
  std::size_t step() {
    out.clear();
    s.schedule(now, out);
    for (const Outcome& o : out) {
      std::visit(
          [this](const auto& d) {
            using T = std::decay_t<decltype(d)>;
            if constexpr (std::is_same_v<T, Grant>) {
              s.complete(d.transfer, d.slot.end, d.slot.length());
              s.replica_ack(d.receiver, d.seq);
              submit(to_int(d.sender));
            } else if constexpr (std::is_same_v<T, Redirect>) {
              s.complete(d.transfer, d.slot.end, d.slot.length());
              submit(to_int(d.sender));
            } else if constexpr (std::is_same_v<T, AggregateGrant>) {
              s.complete(d.transfer, d.slot.end, d.slot.length());
              s.replica_ack(d.receiver, d.seq);
            } else if constexpr (std::is_same_v<T, Drop>) {
              submit(to_int(d.sender));
            }  // Cancel: transfers never fail here
          },
          o);
    }
    if (s.config().ingress == IngressSharing::packed) {
      // The first booking to end frees the share the next grant needs (shares only fall).
      const auto live = s.ingress_shares(EndpointId{kServer})->bookings();
      for (const IngressShares::Booking& b : live) {
        if (b.slot.end > now) {
          now = b.slot.end;
          break;
        }
      }
    } else if (const SlotBook* in = s.ingress(EndpointId{kServer}); in->tail() > now) {
      now = in->tail();
    }
    if (auto wake = s.next_wakeup(); wake && *wake > now) now = *wake;
    return out.size();
  }

  Scheduler s;
  std::vector<Outcome> out;
  Instant now{};
  std::uint64_t next_id = 1;
};

void run(benchmark::State& state, Mode mode, IngressSharing ingress = IngressSharing::exclusive) {
  const auto workers = static_cast<std::uint32_t>(state.range(0));
  Bench b(mode, ingress, workers);
  for (int i = 0; i < 2000; ++i) b.step();  // reach steady state (estimates, aggregates)
  std::uint64_t decisions = 0;
  std::uint64_t calls = 0;
  for (auto _ : state) {
    decisions += b.step();
    ++calls;
  }
  state.counters["pending"] = static_cast<double>(b.s.pending_parts());
  state.counters["decisions_per_call"] = static_cast<double>(decisions) / static_cast<double>(calls);
  state.counters["ns_per_decision"] =
      benchmark::Counter(static_cast<double>(decisions), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetItemsProcessed(static_cast<std::int64_t>(decisions));
}

void BM_DecisionSjf(benchmark::State& state) { run(state, Mode::sjf); }
void BM_DecisionFifo(benchmark::State& state) { run(state, Mode::fifo); }
void BM_DecisionMlfabric(benchmark::State& state) { run(state, Mode::mlfabric); }
void BM_DecisionSjfPacked(benchmark::State& state) { run(state, Mode::sjf, IngressSharing::packed); }
void BM_DecisionMlfabricPacked(benchmark::State& state) { run(state, Mode::mlfabric, IngressSharing::packed); }

BENCHMARK(BM_DecisionSjf)->Arg(100)->Arg(1000)->Arg(10000);
BENCHMARK(BM_DecisionFifo)->Arg(1000);
BENCHMARK(BM_DecisionMlfabric)->Arg(100)->Arg(1000)->Arg(10000);
BENCHMARK(BM_DecisionSjfPacked)->Arg(1000)->Arg(10000);
BENCHMARK(BM_DecisionMlfabricPacked)->Arg(1000)->Arg(10000);

// A whole batch: 1,000 requests from 1,000 workers decided by one schedule() call with an
// unbounded horizon (pending shrinks from 1,000 to 0 during the call).
void BM_Batch(benchmark::State& state) {
  const auto workers = static_cast<std::uint32_t>(state.range(0));
  std::uint64_t decisions = 0;
  for (auto _ : state) {
    state.PauseTiming();
    SchedulerConfig c = config_for(Mode::sjf, IngressSharing::exclusive);
    c.grant_horizon = Nanos{1'000'000'000'000};
    c.replica_bound = std::nullopt;
    Bench b(Mode::sjf, IngressSharing::exclusive, 0);
    b.s = Scheduler(c);
    for (std::uint32_t w = 0; w < workers; ++w) b.submit(w);
    state.ResumeTiming();
    b.s.schedule(b.now, b.out);
    decisions += b.out.size();
  }
  state.counters["ns_per_decision"] =
      benchmark::Counter(static_cast<double>(decisions), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Batch)->Arg(1000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gradlane::sched

BENCHMARK_MAIN();
