// gradlane_sched_sim: a discrete-event simulation of asynchronous parameter-server training
// driven through the scheduling core, comparing a FIFO parameter server with MLfabric's
// ordering (network-aware SJF + staleness bound tau + aggregation).
//
// Model (deliberately simple, so what differs between the two runs is only the scheduler):
//  - N workers push one update of --bytes to a server after each compute step of
//    --compute-ms (uniform +-jitter), then pull the model (instantly) and compute the next.
//    The update is computed on the server version current when its compute step started.
//  - Every NIC direction is a serial resource: a transfer starts at max(its slot start, the
//    moment both NICs are actually free) and runs at min(true egress, true ingress). The
//    scheduler only knows declared line rates and what complete() teaches it; the straggler's
//    egress is --straggler-slowdown times slower than declared.
//  - The server applies updates in sequence order as they arrive (an aggregate is one update);
//    the replica acknowledges each --replica-lag-us later (window B = --replica-bound).
//  - Delay of an applied gradient = (server version it is applied to) - (version computed on),
//    counted per gradient (each member of an aggregate counts).
//  - A dropped update is never sent; its worker pulls and computes again at once.
//
// Reading the results. With n asynchronous workers every update is about n versions stale
// under FIFO (everyone else's update lands while it computes). MLfabric bounds that at tau by
// dropping what cannot make it, and fewer versions are spent per gradient when the server is
// backlogged, because waiting updates are summed. The defaults put the server at about twice
// its capacity (1000 x 1 MiB every 45 ms into 100 Gb/s) with tau = n/2: the regime MLfabric is
// for. With tau far below the natural delay and no backlog, the bound mostly drops (it throttles
// the server to ~tau versions per compute step), which the table shows as drops; a convergence
// model, not this simulator, decides whether that is worth it.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched {
namespace {

struct Params {
  std::uint32_t workers = 1000;
  std::uint32_t servers = 1;
  Bytes bytes = Bytes{1} << 20;
  double compute_ms = 45.0;
  double jitter = 0.2;
  double worker_gbps = 100.0;
  double server_gbps = 100.0;
  std::uint32_t stragglers = 1;
  double straggler_slowdown = 10.0;
  double duration_ms = 2000.0;
  std::uint32_t tau = 500;
  std::uint64_t replica_bound = 64;
  double replica_lag_us = 20.0;
  double horizon_us =
      static_cast<double>(SchedulerConfig{}.grant_horizon.count()) / 1e3;  // the core's default
  std::uint64_t seed = 1;
  std::string policy = "both";
};

struct Result {
  std::string name;
  std::uint64_t submitted = 0;
  std::uint64_t applied = 0;  // gradients applied (each aggregate member counts)
  std::uint64_t drops = 0;
  std::uint64_t server_slots = 0;  // sequence numbers used at the servers
  std::uint64_t aggregates = 0;
  std::uint64_t aggregated = 0;  // gradients that went through an aggregator
  std::vector<std::uint64_t> delays;
  double latency_sum_ms = 0;  // submit -> applied, per applied gradient
  std::uint64_t straggler_applied = 0;
  std::uint64_t straggler_drops = 0;
  double server_busy_ms = 0;
};

constexpr std::uint32_t kServerBase = 1'000'000;
constexpr double kGbps = 1e9 / 8;  // bytes per second in one Gb/s

class Simulation {
 public:
  Simulation(const Params& p, Ordering ordering) : p_(p), rng_(p.seed) {
    SchedulerConfig c;
    c.ordering = ordering;
    c.grant_horizon = Nanos{static_cast<std::int64_t>(p.horizon_us * 1e3)};
    c.replica_bound = p.replica_bound;
    c.bandwidth.default_bytes_per_sec = p.worker_gbps * kGbps;
    if (ordering == Ordering::fifo) {
      c.staleness_bound = std::nullopt;  // a plain parameter server applies everything
      c.aggregation.enabled = false;
      result_.name = "FIFO";
    } else {
      c.staleness_bound = p.tau;
      result_.name = "MLfabric";
    }
    scheduler_.emplace(c);
    for (std::uint32_t s = 0; s < p.servers; ++s) {
      const EndpointId id = server(s);
      scheduler_->set_rate(id, Direction::ingress, p.server_gbps * kGbps);
      scheduler_->set_rate(id, Direction::egress, p.server_gbps * kGbps);
      true_in_[id] = p.server_gbps * kGbps;
      next_apply_[id] = 1;
    }
    workers_.resize(p.workers);
    for (std::uint32_t w = 0; w < p.workers; ++w) {
      const EndpointId id = worker(w);
      // The scheduler is told every worker's nominal rate; the straggler's is a lie it must
      // discover from completed transfers.
      scheduler_->set_rate(id, Direction::egress, p.worker_gbps * kGbps);
      scheduler_->set_rate(id, Direction::ingress, p.worker_gbps * kGbps);
      true_out_[id] = p.worker_gbps * kGbps / (w < p.stragglers ? p.straggler_slowdown : 1.0);
      true_in_[id] = p.worker_gbps * kGbps;
      scheduler_->add_aggregator(JobId{1}, id);
      start_compute(w, Instant{});
    }
  }

  Result run() {
    const Instant end{Nanos{static_cast<std::int64_t>(p_.duration_ms * 1e6)}};
    while (!events_.empty() && events_.top().at <= end) {
      const Instant now = events_.top().at;
      while (!events_.empty() && events_.top().at == now) {
        const Event e = events_.top();
        events_.pop();
        handle(e, now);
      }
      decide(now);
    }
    result_.server_slots = 0;
    for (std::uint32_t s = 0; s < p_.servers; ++s) {
      result_.server_slots += scheduler_->server_version(server(s));
    }
    result_.aggregates = scheduler_->stats().aggregates;
    result_.aggregated = scheduler_->stats().redirects;
    return result_;
  }

 private:
  enum class Kind { compute_done, transfer_done, replica_ack, wake };
  struct Event {
    Instant at;
    std::uint64_t order;  // FIFO among equal times: deterministic
    Kind kind;
    std::uint64_t a;      // worker index / transfer id / server index
    std::uint64_t b;      // seq for acks
    bool operator>(const Event& o) const { return std::tie(at, order) > std::tie(o.at, o.order); }
  };
  struct Worker {
    Version computed_on = 0;
  };
  struct Transfer {
    EndpointId out, in;
    std::uint64_t aggregate = 0;  // for member transfers: the aggregate it feeds
    bool to_server = false;
    bool direct = false;          // a worker's own update straight to the server
    Seq seq = 0;
    std::vector<std::pair<RequestId, std::uint32_t>> gradients;  // (request, worker)
  };
  struct Pending {  // an aggregate being collected
    std::size_t expected = 0;
    std::size_t arrived = 0;
    Instant last_arrival{};
    std::optional<AggregateGrant> grant;
  };

  static EndpointId worker(std::uint32_t w) { return EndpointId{w + 1}; }
  static EndpointId server(std::uint32_t s) { return EndpointId{kServerBase + s}; }

  void push(Instant at, Kind kind, std::uint64_t a, std::uint64_t b = 0) {
    events_.push(Event{at, order_++, kind, a, b});
  }

  void start_compute(std::uint32_t w, Instant now) {
    workers_[w].computed_on = applied_[server(w % p_.servers)];
    std::uniform_real_distribution<double> u(1.0 - p_.jitter, 1.0 + p_.jitter);
    const auto ns = static_cast<std::int64_t>(p_.compute_ms * 1e6 * u(rng_));
    push(now + Nanos{ns}, Kind::compute_done, w);
  }

  void handle(const Event& e, Instant now) {
    switch (e.kind) {
      case Kind::compute_done: {
        const auto w = static_cast<std::uint32_t>(e.a);
        Request r;
        r.id = RequestId{next_request_++};
        r.job = JobId{1};
        r.sender = worker(w);
        r.receiver = server(w % p_.servers);
        r.tensor = TensorId{1};
        r.bytes = p_.bytes;
        r.computed_on = workers_[w].computed_on;
        submit_time_[r.id] = now;
        owner_[r.id] = w;
        computed_on_[r.id] = r.computed_on;
        if (scheduler_->submit(r, now) != SubmitStatus::accepted) std::abort();
        ++result_.submitted;
        break;
      }
      case Kind::transfer_done:
        finish_transfer(e.a, now);
        break;
      case Kind::replica_ack:
        scheduler_->replica_ack(server(static_cast<std::uint32_t>(e.a)), e.b);
        break;
      case Kind::wake:
        break;
    }
  }

  void decide(Instant now) {
    out_.clear();
    scheduler_->schedule(now, out_);
    for (const Outcome& o : out_) {
      if (const Grant* g = std::get_if<Grant>(&o)) {
        Transfer t{g->sender, g->receiver, 0, true, true, g->seq,
                   {{g->request, owner_.at(g->request)}}};
        start(to_int(g->transfer), std::move(t), g->slot.start, g->length, now);
      } else if (const Redirect* r = std::get_if<Redirect>(&o)) {
        pending_[to_int(r->aggregate)].expected += 1;
        Transfer t{r->sender, r->aggregator, to_int(r->aggregate), false, false, 0,
                   {{r->request, owner_.at(r->request)}}};
        start(to_int(r->transfer), std::move(t), r->slot.start, r->length, now);
      } else if (const AggregateGrant* a = std::get_if<AggregateGrant>(&o)) {
        Pending& pa = pending_[to_int(a->aggregate)];
        pa.grant = *a;
        if (pa.arrived == pa.expected) launch_aggregate(to_int(a->aggregate), now);
      } else if (const Drop* d = std::get_if<Drop>(&o)) {
        const std::uint32_t w = owner_.at(d->request);
        ++result_.drops;
        if (w < p_.stragglers) ++result_.straggler_drops;
        start_compute(w, now);  // pull a fresh model, compute again
      }
    }
    // Work held back only by the grant horizon needs a decision at that time even if no
    // other event happens then.
    if (const auto wake = scheduler_->next_wakeup(); wake && *wake > now && wake != scheduled_wake_) {
      scheduled_wake_ = *wake;
      push(*wake, Kind::wake, 0);
    }
  }

  void start(std::uint64_t id, Transfer t, Instant slot_start, Bytes bytes, Instant now) {
    Instant& out_free = busy_out_[t.out];
    Instant& in_free = busy_in_[t.in];
    const Instant begin = std::max({slot_start, now, out_free, in_free});
    const double rate = std::min(true_out_.count(t.out) ? true_out_[t.out] : p_.server_gbps * kGbps,
                                 true_in_.at(t.in));
    const Nanos length{static_cast<std::int64_t>(static_cast<double>(bytes) * 1e9 / rate) + 1};
    out_free = in_free = begin + length;
    if (t.to_server) {
      result_.server_busy_ms += static_cast<double>(length.count()) / 1e6;
    }
    begins_[id] = begin;
    transfers_.emplace(id, std::move(t));
    push(begin + length, Kind::transfer_done, id);
  }

  void launch_aggregate(std::uint64_t aggregate, Instant now) {
    Pending& pa = pending_.at(aggregate);
    const AggregateGrant& a = *pa.grant;
    Transfer t{a.aggregator, a.receiver, 0, true, false, a.seq, {}};
    for (const PartRef& m : a.members) t.gradients.emplace_back(m.request, owner_.at(m.request));
    const Instant ready = std::max(now, pa.last_arrival + scheduler_->config().aggregation.sum_time);
    start(to_int(a.transfer), std::move(t), std::max(a.slot.start, ready), a.length, now);
    pending_.erase(aggregate);
  }

  void finish_transfer(std::uint64_t id, Instant now) {
    Transfer t = std::move(transfers_.at(id));
    transfers_.erase(id);
    const Instant begin = begins_.at(id);
    begins_.erase(id);
    scheduler_->complete(TransferId{id}, now, now - begin);
    if (!t.to_server) {  // a member reached its aggregator; its worker goes on
      const std::uint32_t w = t.gradients.front().second;
      start_compute(w, now);
      Pending& pa = pending_[t.aggregate];
      ++pa.arrived;
      pa.last_arrival = std::max(pa.last_arrival, now);
      if (pa.grant && pa.arrived == pa.expected) launch_aggregate(t.aggregate, now);
      return;
    }
    if (t.direct) start_compute(t.gradients.front().second, now);  // its push is done
    // Apply in sequence order at the server.
    arrived_[t.in][t.seq] = std::move(t.gradients);
    Seq& next = next_apply_[t.in];
    auto& arrived = arrived_[t.in];
    while (!arrived.empty() && arrived.begin()->first == next) {
      for (const auto& [request, w] : arrived.begin()->second) {
        const Version v = computed_on_.at(request);
        result_.delays.push_back((next - 1) - v);
        ++result_.applied;
        if (w < p_.stragglers) ++result_.straggler_applied;
        result_.latency_sum_ms +=
            static_cast<double>((now - submit_time_.at(request)).count()) / 1e6;
        computed_on_.erase(request);
        submit_time_.erase(request);
      }
      applied_[t.in] = next;
      const std::uint32_t s = to_int(t.in) - kServerBase;
      push(now + Nanos{static_cast<std::int64_t>(p_.replica_lag_us * 1e3)}, Kind::replica_ack, s,
           next);
      arrived.erase(arrived.begin());
      ++next;
    }
  }

  Params p_;
  std::mt19937_64 rng_;
  std::optional<Scheduler> scheduler_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t order_ = 0;
  std::uint64_t next_request_ = 1;
  std::vector<Worker> workers_;
  std::map<EndpointId, double> true_out_, true_in_;
  std::map<EndpointId, Instant> busy_out_, busy_in_;
  std::map<EndpointId, Version> applied_;
  std::map<EndpointId, Seq> next_apply_;
  std::map<EndpointId, std::map<Seq, std::vector<std::pair<RequestId, std::uint32_t>>>> arrived_;
  std::map<RequestId, std::uint32_t> owner_;
  std::map<RequestId, Version> computed_on_;
  std::map<RequestId, Instant> submit_time_;
  std::map<std::uint64_t, Transfer> transfers_;
  std::map<std::uint64_t, Instant> begins_;
  std::map<std::uint64_t, Pending> pending_;
  std::optional<Instant> scheduled_wake_;
  std::vector<Outcome> out_;
  Result result_;
};

}  // namespace
}  // namespace gradlane::sched

int main(int argc, char** argv) {
  using namespace gradlane::sched;
  Params p;
  CLI::App app{"gradlane_sched_sim: FIFO vs MLfabric scheduling of async parameter-server updates"};
  app.add_option("--workers", p.workers, "number of workers")->check(CLI::Range(1u, 100000u));
  app.add_option("--servers", p.servers, "number of servers (worker w pushes to w % servers)")
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--bytes", p.bytes, "update size in bytes")->check(CLI::Range(Bytes{1}, Bytes{1} << 34));
  app.add_option("--compute-ms", p.compute_ms, "mean compute time per step")->check(CLI::PositiveNumber);
  app.add_option("--jitter", p.jitter, "compute time is uniform in mean*(1 +- jitter)")
      ->check(CLI::Range(0.0, 0.99));
  app.add_option("--worker-gbps", p.worker_gbps, "worker NIC line rate")->check(CLI::PositiveNumber);
  app.add_option("--server-gbps", p.server_gbps, "server NIC line rate")->check(CLI::PositiveNumber);
  app.add_option("--stragglers", p.stragglers, "workers with a slowed egress");
  app.add_option("--straggler-slowdown", p.straggler_slowdown, "their egress is this many times slower")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--duration-ms", p.duration_ms, "simulated time")->check(CLI::PositiveNumber);
  app.add_option("--tau", p.tau, "staleness bound for the MLfabric run");
  app.add_option("--replica-bound", p.replica_bound, "B: sequence numbers ahead of the replica")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("--replica-lag-us", p.replica_lag_us, "replica acknowledges this long after apply")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--horizon-us", p.horizon_us, "grant horizon")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", p.seed, "random seed (compute times)");
  app.add_option("--policy", p.policy, "fifo, mlfabric or both")
      ->check(CLI::IsMember({"fifo", "mlfabric", "both"}));
  CLI11_PARSE(app, argc, argv);
  if (p.stragglers > p.workers) {
    fmt::print(stderr, "--stragglers ({}) cannot exceed --workers ({})\n", p.stragglers, p.workers);
    return 2;
  }

  std::vector<Result> results;
  if (p.policy != "mlfabric") results.push_back(Simulation(p, Ordering::fifo).run());
  if (p.policy != "fifo") results.push_back(Simulation(p, Ordering::mlfabric).run());

  fmt::print(
      "gradlane_sched_sim: {} workers -> {} server(s), {:.2f} MiB updates, compute {} ms +-{:.0f}%,\n"
      "  workers {} Gb/s, servers {} Gb/s, {} straggler(s) at 1/{} egress, tau {}, B {}, "
      "{} ms simulated, seed {}\n\n",
      p.workers, p.servers, static_cast<double>(p.bytes) / (1 << 20), p.compute_ms, p.jitter * 100,
      p.worker_gbps, p.server_gbps, p.stragglers, p.straggler_slowdown, p.tau, p.replica_bound,
      p.duration_ms, p.seed);
  fmt::print("{:<34}", "");
  for (const Result& r : results) fmt::print("{:>14}", r.name);
  fmt::print("\n");
  auto row = [&](const char* label, auto value) {
    fmt::print("{:<34}", label);
    for (const Result& r : results) fmt::print("{:>14}", value(r));
    fmt::print("\n");
  };
  auto percentile = [](std::vector<std::uint64_t> v, double q) -> std::uint64_t {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
  };
  row("updates submitted", [](const Result& r) { return fmt::format("{}", r.submitted); });
  row("gradients applied", [](const Result& r) { return fmt::format("{}", r.applied); });
  row("mean delay (versions)", [](const Result& r) {
    double sum = 0;
    for (auto d : r.delays) sum += static_cast<double>(d);
    return fmt::format("{:.1f}", r.delays.empty() ? 0.0 : sum / static_cast<double>(r.delays.size()));
  });
  row("p99 delay (versions)", [&](const Result& r) { return fmt::format("{}", percentile(r.delays, 0.99)); });
  row("max delay (versions)", [&](const Result& r) { return fmt::format("{}", percentile(r.delays, 1.0)); });
  row("applied with delay <= tau", [&](const Result& r) {
    return fmt::format("{}", std::count_if(r.delays.begin(), r.delays.end(),
                                           [&](std::uint64_t d) { return d <= p.tau; }));
  });
  row("drops (never sent)", [](const Result& r) { return fmt::format("{}", r.drops); });
  row("server slots used", [](const Result& r) { return fmt::format("{}", r.server_slots); });
  row("aggregates (gradients in them)", [](const Result& r) {
    return fmt::format("{} ({})", r.aggregates, r.aggregated);
  });
  row("gradients applied per second", [&](const Result& r) {
    return fmt::format("{:.0f}", static_cast<double>(r.applied) / (p.duration_ms / 1e3));
  });
  row("mean submit->applied (ms)", [](const Result& r) {
    return fmt::format("{:.2f}", r.applied ? r.latency_sum_ms / static_cast<double>(r.applied) : 0.0);
  });
  row("server ingress busy (%)", [&](const Result& r) {
    return fmt::format("{:.1f}", 100.0 * r.server_busy_ms / (p.duration_ms * p.servers));
  });
  row("straggler applied / dropped", [](const Result& r) {
    return fmt::format("{} / {}", r.straggler_applied, r.straggler_drops);
  });
  return 0;
}
