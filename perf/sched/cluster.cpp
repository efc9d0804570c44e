#include "perf/sched/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <variant>

namespace gradlane::sched::sim {
namespace {

constexpr std::uint32_t kServerBase = 1'000'000;
constexpr double kGbps = 1e9 / 8;  // bytes per second in one Gb/s

Nanos from_ms(double ms) { return Nanos{static_cast<std::int64_t>(ms * 1e6)}; }

}  // namespace

const char* to_string(Mode mode) {
  switch (mode) {
    case Mode::fifo: return "fifo";
    case Mode::gradlane: return "gradlane";
    case Mode::sync: return "sync";
  }
  return "?";
}

Mode parse_mode(const std::string& name) {
  if (name == "fifo") return Mode::fifo;
  if (name == "gradlane") return Mode::gradlane;
  if (name == "sync") return Mode::sync;
  throw std::invalid_argument("unknown mode '" + name + "': use gradlane, fifo or sync");
}

std::optional<std::string> ClusterParams::validate() const {
  if (workers == 0) return "workers must be at least 1";
  if (servers == 0) return "servers must be at least 1";
  if (stragglers > workers) return "stragglers cannot exceed workers";
  if (mode == Mode::sync && servers != 1) return "sync mode simulates one server";
  if (bytes == 0) return "bytes must be positive";
  if (!(compute_ms > 0) || !(worker_gbps > 0) || !(server_gbps > 0)) {
    return "compute time and line rates must be positive";
  }
  if (!(jitter >= 0 && jitter < 1)) return "jitter must be in [0, 1)";
  if (!(spread >= 1)) return "spread must be at least 1 (1: every worker at its line rate)";
  if (!(change_ms >= 0) || !(change_fraction >= 0 && change_fraction <= 1)) {
    return "change interval must be >= 0 and the changed fraction in [0, 1]";
  }
  if (!(straggler_slowdown >= 1)) return "straggler slowdown must be at least 1";
  return std::nullopt;
}

EndpointId Cluster::server(std::uint32_t s) { return EndpointId{kServerBase + s}; }

Cluster::Cluster(const ClusterParams& p, Observer* observer)
    : p_(p), observer_(observer), rng_(p.seed), net_rng_(p.seed ^ 0x9e3779b97f4a7c15ULL) {
  if (const auto bad = p.validate()) throw std::invalid_argument(*bad);
  SchedulerConfig c;
  c.ordering = p.mode == Mode::gradlane ? Ordering::mlfabric : Ordering::fifo;
  c.grant_horizon = Nanos{static_cast<std::int64_t>(p.horizon_us * 1e3)};
  c.replica_bound = p.replica_bound;
  c.bandwidth.default_bytes_per_sec = p.worker_gbps * kGbps;
  if (p.mode == Mode::gradlane) {
    c.staleness_bound = p.tau;
    c.aggregation.enabled = p.aggregation;
  } else {  // a plain parameter server applies everything, one update per push
    c.staleness_bound = std::nullopt;
    c.aggregation.enabled = false;
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
  factor_.assign(p.workers, 1.0);
  for (std::uint32_t w = 0; w < p.workers; ++w) {
    const EndpointId id = worker(w);
    // The scheduler is told every worker's nominal rate; the true one (uneven, changing, the
    // straggler's) is a lie it must discover from completed transfers.
    scheduler_->set_rate(id, Direction::egress, p.worker_gbps * kGbps);
    scheduler_->set_rate(id, Direction::ingress, p.worker_gbps * kGbps);
    if (p.spread > 1) factor_[w] = draw_factor();
    true_in_[id] = p.worker_gbps * kGbps;
    scheduler_->add_aggregator(JobId{1}, id);
    start_compute(w, Instant{});
  }
  if (p.change_ms > 0) push(Instant{} + from_ms(p.change_ms), Kind::bandwidth_change, 0);
}

double Cluster::draw_factor() {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  return std::exp(-u(net_rng_) * std::log(p_.spread));  // log-uniform in [1/spread, 1]
}

double Cluster::worker_egress(std::uint32_t w) const {
  return p_.worker_gbps * kGbps * factor_[w] / (w < p_.stragglers ? p_.straggler_slowdown : 1.0);
}

void Cluster::push(Instant at, Kind kind, std::uint64_t a, std::uint64_t b) {
  events_.push(Event{at, order_++, kind, a, b});
}

void Cluster::run_until(Instant end) {
  while (!events_.empty() && events_.top().at <= end) {
    const Instant now = events_.top().at;
    now_ = now;
    while (!events_.empty() && events_.top().at == now) {
      const Event e = events_.top();
      events_.pop();
      handle(e, now);
    }
    decide(now);
  }
  now_ = std::max(now_, end);
}

const ClusterStats& Cluster::stats() {
  stats_.server_slots = 0;
  for (std::uint32_t s = 0; s < p_.servers; ++s) stats_.server_slots += scheduler_->server_version(server(s));
  stats_.aggregates = scheduler_->stats().aggregates;
  stats_.aggregated = scheduler_->stats().redirects;
  return stats_;
}

void Cluster::start_compute(std::uint32_t w, Instant now) {
  workers_[w].computed_on = applied_[server(w % p_.servers)];
  workers_[w].token = observer_ ? observer_->pulled(w) : 0;
  std::uniform_real_distribution<double> u(1.0 - p_.jitter, 1.0 + p_.jitter);
  const auto ns = static_cast<std::int64_t>(p_.compute_ms * 1e6 * u(rng_));
  push(now + Nanos{ns}, Kind::compute_done, w);
}

void Cluster::handle(const Event& e, Instant now) {
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
      gradients_[r.id] = Gradient{r.id, w, r.computed_on, workers_[w].token};
      if (scheduler_->submit(r, now) != SubmitStatus::accepted) {
        throw std::logic_error("Cluster: the scheduler refused a well-formed request");
      }
      ++stats_.submitted;
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
    case Kind::bandwidth_change:
      change_bandwidth(now);
      break;
  }
}

void Cluster::change_bandwidth(Instant now) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::uint32_t w = 0; w < p_.workers; ++w) {
    if (u(net_rng_) < p_.change_fraction) factor_[w] = draw_factor();
  }
  push(now + from_ms(p_.change_ms), Kind::bandwidth_change, 0);
}

void Cluster::decide(Instant now) {
  out_.clear();
  scheduler_->schedule(now, out_);
  ++stats_.schedule_calls;
  stats_.peak_pending_aggregates = std::max(stats_.peak_pending_aggregates, scheduler_->pending_aggregates());
  for (const Outcome& o : out_) {
    if (const Grant* g = std::get_if<Grant>(&o)) {
      Transfer t{g->sender, g->receiver, 0, true, true, g->seq, g->length, {g->request}};
      start(to_int(g->transfer), std::move(t), g->slot.start, now);
    } else if (const Redirect* r = std::get_if<Redirect>(&o)) {
      pending_[to_int(r->aggregate)].expected += 1;
      Transfer t{r->sender, r->aggregator, to_int(r->aggregate), false, false, 0, r->length, {r->request}};
      start(to_int(r->transfer), std::move(t), r->slot.start, now);
    } else if (const AggregateGrant* a = std::get_if<AggregateGrant>(&o)) {
      Pending& pa = pending_[to_int(a->aggregate)];
      pa.grant = *a;
      if (pa.arrived == pa.expected) launch_aggregate(to_int(a->aggregate), now);
    } else if (const Drop* d = std::get_if<Drop>(&o)) {
      const auto it = gradients_.find(d->request);
      const Gradient dropped = it->second;
      gradients_.erase(it);
      submit_time_.erase(d->request);
      ++stats_.drops;
      if (dropped.worker < p_.stragglers) ++stats_.straggler_drops;
      if (observer_) observer_->dropped(dropped);
      start_compute(dropped.worker, now);  // pull a fresh model, compute again
    }
  }
  // Work held back only by the grant horizon needs a decision at that time even if no
  // other event happens then.
  if (const auto wake = scheduler_->next_wakeup(); wake && *wake > now && wake != scheduled_wake_) {
    scheduled_wake_ = *wake;
    push(*wake, Kind::wake, 0);
  }
}

void Cluster::start(std::uint64_t id, Transfer t, Instant slot_start, Instant now) {
  Instant& out_free = busy_out_[t.out];
  Instant& in_free = busy_in_[t.in];
  const Instant begin = std::max({slot_start, now, out_free, in_free});
  const std::uint32_t sender = to_int(t.out) - 1;  // only workers send (aggregators are workers)
  const double rate = std::min(worker_egress(sender), true_in_.at(t.in));
  const Nanos length{static_cast<std::int64_t>(static_cast<double>(t.bytes) * 1e9 / rate) + 1};
  out_free = in_free = begin + length;
  if (t.to_server) {
    stats_.server_busy_ms += static_cast<double>(length.count()) / 1e6;
    stats_.server_ingress_bytes += t.bytes;
  }
  begins_[id] = begin;
  transfers_.emplace(id, std::move(t));
  push(begin + length, Kind::transfer_done, id);
}

void Cluster::launch_aggregate(std::uint64_t aggregate, Instant now) {
  Pending& pa = pending_.at(aggregate);
  const AggregateGrant& a = *pa.grant;
  Transfer t{a.aggregator, a.receiver, 0, true, false, a.seq, a.length, {}};
  for (const PartRef& m : a.members) t.gradients.push_back(m.request);
  const Instant ready = std::max(now, pa.last_arrival + scheduler_->config().aggregation.sum_time);
  start(to_int(a.transfer), std::move(t), std::max(a.slot.start, ready), now);
  pending_.erase(aggregate);
}

void Cluster::finish_transfer(std::uint64_t id, Instant now) {
  Transfer t = std::move(transfers_.at(id));
  transfers_.erase(id);
  const Instant begin = begins_.at(id);
  begins_.erase(id);
  scheduler_->complete(TransferId{id}, now, now - begin);
  if (!t.to_server) {  // a member reached its aggregator; its worker goes on
    start_compute(gradients_.at(t.gradients.front()).worker, now);
    Pending& pa = pending_[t.aggregate];
    ++pa.arrived;
    pa.last_arrival = std::max(pa.last_arrival, now);
    if (pa.grant && pa.arrived == pa.expected) launch_aggregate(t.aggregate, now);
    return;
  }
  // Its push is done: an asynchronous worker pulls and goes on (a synchronous one waits for
  // the step) — after the server applied what it can, so the pull sees the worker's own update
  // unless an earlier sequence number is still on its way.
  const bool goes_on = t.direct && p_.mode != Mode::sync;
  const std::uint32_t pusher = goes_on ? gradients_.at(t.gradients.front()).worker : 0;
  // Apply in sequence order at the server.
  arrived_[t.in][t.seq] = std::move(t.gradients);
  Seq& next = next_apply_[t.in];
  auto& arrived = arrived_[t.in];
  while (!arrived.empty() && arrived.begin()->first == next) {
    apply(t.in, std::move(arrived.begin()->second), next, now);
    arrived.erase(arrived.begin());
    ++next;
  }
  if (goes_on) start_compute(pusher, now);
}

void Cluster::apply(EndpointId at, std::vector<RequestId> requests, Seq seq, Instant now) {
  scratch_.clear();
  for (const RequestId request : requests) {
    const auto it = gradients_.find(request);
    const Gradient g = it->second;
    gradients_.erase(it);
    stats_.delays.push_back((seq - 1) - g.computed_on);
    ++stats_.applied;
    if (g.worker < p_.stragglers) ++stats_.straggler_applied;
    stats_.latency_sum_ms += static_cast<double>((now - submit_time_.at(request)).count()) / 1e6;
    submit_time_.erase(request);
    scratch_.push_back(g);
  }
  applied_[at] = seq;
  push(now + Nanos{static_cast<std::int64_t>(p_.replica_lag_us * 1e3)}, Kind::replica_ack,
       to_int(at) - kServerBase, seq);
  if (p_.mode != Mode::sync) {
    if (observer_) observer_->applied(scratch_, now);
    return;
  }
  // Sync: the step is applied once all N of its updates are in; then everyone pulls it.
  step_.insert(step_.end(), scratch_.begin(), scratch_.end());
  if (step_.size() < p_.workers) return;
  ++stats_.steps;
  if (observer_) observer_->applied(step_, now);
  step_.clear();
  for (std::uint32_t w = 0; w < p_.workers; ++w) start_compute(w, now);
}

}  // namespace gradlane::sched::sim
