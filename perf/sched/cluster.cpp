// The simulated cluster (cluster.hpp): its events, workers' steps, decisions through the
// scheduling core, and applying what arrives. Its settings are in cluster_params.cpp, its wire
// in cluster_wire.cpp, what its allreduce rounds decide in allreduce_rounds.cpp.
#include "perf/sched/cluster.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <variant>

namespace gradlane::sched::sim {
namespace {

Nanos from_ms(double ms) { return Nanos{static_cast<std::int64_t>(ms * 1e6)}; }

// fair: fifo and sync are granted everything at once (a plain parameter server has every
// worker write as soon as its update is ready), so their grant horizon is longer than any run.
constexpr Nanos kGrantAtOnce = std::chrono::hours{24 * 365};

// Pulls are transfers of the cluster's own, never the scheduler's: their ids start here.
constexpr std::uint64_t kPullIdBase = std::uint64_t{1} << 62;

}  // namespace

EndpointId Cluster::server(std::uint32_t s) { return EndpointId{kServerBase + s}; }

Cluster::Cluster(const ClusterParams& p, Observer* observer)
    : p_(p), observer_(observer), rng_(p.seed), net_rng_(p.seed ^ 0x9e3779b97f4a7c15ULL), rounds_(p) {
  if (const auto bad = p.validate()) throw std::invalid_argument(*bad);
  SchedulerConfig c;
  const bool gradlane_grants = uses_gradlane_grants(p.mode);
  c.ordering = gradlane_grants ? Ordering::mlfabric : Ordering::fifo;
  c.ingress = gradlane_grants && p.network == NetworkModel::fair ? p.ingress : IngressSharing::exclusive;
  c.grant_horizon = Nanos{static_cast<std::int64_t>(p.horizon_us * 1e3)};
  if (p.network == NetworkModel::fair && !gradlane_grants) c.grant_horizon = kGrantAtOnce;
  c.replica_bound = p.replica_bound;
  c.bandwidth.default_bytes_per_sec = p.worker_gbps * kGbps;
  if (gradlane_grants) {
    // A round of gradlane-local waits for every worker's model: none may be dropped.
    c.staleness_bound = p.mode == Mode::gradlane ? p.tau : std::nullopt;
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
  if (!is_synchronous(p.mode)) clock_counts_[0] = p.workers;
  server_flows_.assign(p.servers, 0);
  link_index_.assign(2 * (std::size_t{p.workers} + p.servers), -1);
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
    take_snapshot(w);  // every worker starts from the initial model
    start_compute(w, Instant{});
  }
  if (p.change_ms > 0) push(Instant{} + from_ms(p.change_ms), Kind::bandwidth_change, 0);
  if (skips_slowest(p.mode) && p.probe_bytes > 0) probe_links();
}

double server_ingress_byte_utilisation(const ClusterParams& p, const ClusterStats& s, double elapsed_ms) {
  if (!(elapsed_ms > 0)) return 0.0;
  const double line_bytes = p.server_gbps * kGbps * p.servers * elapsed_ms / 1e3;
  return static_cast<double>(s.server_ingress_bytes) / line_bytes;
}

double Cluster::draw_factor() {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  return std::exp(-u(net_rng_) * std::log(p_.spread));  // log-uniform in [1/spread, 1]
}

double Cluster::worker_egress(std::uint32_t w) const {
  return p_.worker_gbps * kGbps * factor_[w] / (w < p_.stragglers ? p_.straggler_slowdown : 1.0);
}

std::vector<double> Cluster::workers_egress() const {
  std::vector<double> egress(p_.workers);
  for (std::uint32_t w = 0; w < p_.workers; ++w) egress[w] = worker_egress(w);
  return egress;
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
    if (wire_changed_) reshare(now);
  }
  now_ = std::max(now_, end);
  // Nothing changes rates before the next event (after `end`): the bytes up to `end` are known.
  if (p_.network == NetworkModel::fair) advance_wire(now_);
}

const ClusterStats& Cluster::stats() {
  stats_.server_slots = 0;
  for (std::uint32_t s = 0; s < p_.servers; ++s) stats_.server_slots += scheduler_->server_version(server(s));
  stats_.aggregates = scheduler_->stats().aggregates;
  stats_.aggregated = scheduler_->stats().redirects;
  stats_.rounds_by_ring = rounds_.rounds_by_ring();
  if (p_.network == NetworkModel::fair) {
    stats_.server_ingress_bytes = static_cast<Bytes>(std::llround(server_bytes_carried_));
    stats_.server_egress_bytes = static_cast<Bytes>(std::llround(server_bytes_sent_));
  }
  return stats_;
}

bool Cluster::prices_pulls() const {
  return p_.pulls == PullCost::priced && p_.network == NetworkModel::fair && !allreduces(p_.mode);
}

void Cluster::take_snapshot(std::uint32_t w) {
  Worker& worker = workers_[w];
  worker.computed_on = applied_[server(w % p_.servers)];
  worker.token = observer_ ? observer_->pulled(w) : 0;
}

void Cluster::pull(std::uint32_t w, Instant now) {
  take_snapshot(w);  // the server sends the model current when the pull begins
  if (!prices_pulls()) {
    start_compute(w, now);
    return;
  }
  workers_[w].pulling = true;
  const std::uint64_t id = kPullIdBase + next_pull_++;
  Transfer t{server(w % p_.servers), worker(w), 0, false, false, 0, p_.bytes, {}, true, w, workers_[w].clock};
  transfers_.emplace(id, std::move(t));
  put_on_wire(id, now);
}

void Cluster::finish_pull(const Transfer& t, Instant now) {
  Worker& worker = workers_[t.puller];
  ++stats_.pulls;
  if (t.clock != worker.clock) return;  // backup: its step was applied meanwhile, it pulls again
  worker.pulling = false;
  start_compute(t.puller, now);
}

void Cluster::start_compute(std::uint32_t w, Instant now) {
  Worker& worker = workers_[w];
  worker.computing = true;
  if (!clock_counts_.empty()) {
    stats_.max_clock_lead = std::max(stats_.max_clock_lead, worker.clock - slowest_clock());
  }
  std::uniform_real_distribution<double> u(1.0 - p_.jitter, 1.0 + p_.jitter);
  double compute_ns = p_.compute_ms * 1e6 * u(rng_);
  if (averages_models(p_.mode)) {
    for (std::uint32_t h = 1; h < p_.local_steps; ++h) compute_ns += p_.compute_ms * 1e6 * u(rng_);
  }
  const auto ns = static_cast<std::int64_t>(compute_ns);
  // The clock goes with the event: backup abandons a computation by moving the clock on.
  push(now + Nanos{ns}, Kind::compute_done, w, worker.clock);
}

void Cluster::finish_step(std::uint32_t w, Instant now) {
  std::uint64_t& clock = workers_[w].clock;
  const auto at = clock_counts_.find(clock);
  if (--at->second == 0) clock_counts_.erase(at);
  ++clock;
  ++clock_counts_[clock];
  if (p_.mode == Mode::ssp && clock > slowest_clock() + p_.ssp_bound) {
    waiting_by_clock_[clock].push_back(w);
    ++stats_.ssp_waits;
  } else {
    pull(w, now);
  }
  start_waiting_workers(now);  // this may have been the slowest
}

void Cluster::start_waiting_workers(Instant now) {
  while (!waiting_by_clock_.empty() && waiting_by_clock_.begin()->first <= slowest_clock() + p_.ssp_bound) {
    const std::vector<std::uint32_t> ready = std::move(waiting_by_clock_.begin()->second);
    waiting_by_clock_.erase(waiting_by_clock_.begin());
    for (const std::uint32_t w : ready) pull(w, now);
  }
}

void Cluster::handle(const Event& e, Instant now) {
  switch (e.kind) {
    case Kind::compute_done: {
      const auto w = static_cast<std::uint32_t>(e.a);
      if (e.b != workers_[w].clock) break;  // abandoned: its step was applied without it
      workers_[w].computing = false;
      Request r;
      r.id = RequestId{next_request_++};
      r.job = JobId{1};
      r.sender = worker(w);
      r.receiver = server(w % p_.servers);
      r.tensor = TensorId{1};
      r.bytes = p_.bytes;
      r.computed_on = workers_[w].computed_on;
      submit_time_[r.id] = now;
      gradients_[r.id] = Gradient{r.id, w, r.computed_on, workers_[w].token, workers_[w].clock, 0};
      if (allreduces(p_.mode)) {
        join_ring(r.id, now);
        break;
      }
      if (scheduler_->submit(r, now) != SubmitStatus::accepted) {
        throw std::logic_error("Cluster: the scheduler refused a well-formed request");
      }
      ++stats_.submitted;
      break;
    }
    case Kind::transfer_start:
      put_on_wire(e.a, now);
      break;
    case Kind::transfer_done:
      finish_transfer(e.a, now);
      break;
    case Kind::wire_done:
      if (e.a == wire_generation_) finish_due_flows(now);
      break;
    case Kind::replica_ack:
      scheduler_->replica_ack(server(static_cast<std::uint32_t>(e.a)), e.b);
      break;
    case Kind::wake:
      break;
    case Kind::allreduce_done:
      finish_allreduce(now);
      break;
    case Kind::bandwidth_change:
      change_bandwidth(now);
      break;
    case Kind::links_probed:
      probing_ = false;
      rounds_.measure(workers_egress());
      if (ring_ready_.size() == p_.workers) start_round(now);
      break;
  }
}

void Cluster::change_bandwidth(Instant now) {
  if (p_.network == NetworkModel::fair) {  // the old rates held until now; the new ones from now
    advance_wire(now);
    wire_changed_ = true;
  }
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
      const std::uint32_t w = gradients_.at(d->request).worker;
      drop_submitted(d->request);
      finish_step(w, now);  // pull a fresh model, compute again
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
  if (p_.network == NetworkModel::exclusive) {
    start_exclusive(id, std::move(t), slot_start, now);
    return;
  }
  // fifo and sync send as soon as granted; gradlane at its slot start (the scheduler's whole
  // point is when each transfer begins). Either way it then shares the links.
  const Instant begin = uses_gradlane_grants(p_.mode) ? std::max(slot_start, now) : now;
  transfers_.emplace(id, std::move(t));
  if (begin > now) {
    push(begin, Kind::transfer_start, id);
  } else {
    put_on_wire(id, now);
  }
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
  if (t.pull) {
    finish_pull(t, now);
    return;
  }
  scheduler_->complete(TransferId{id}, now, now - begin);
  if (!t.to_server) {  // a member reached its aggregator; an asynchronous worker goes on
    if (!is_synchronous(p_.mode)) finish_step(gradients_.at(t.gradients.front()).worker, now);
    Pending& pa = pending_[t.aggregate];
    ++pa.arrived;
    pa.last_arrival = std::max(pa.last_arrival, now);
    if (pa.grant && pa.arrived == pa.expected) launch_aggregate(t.aggregate, now);
    return;
  }
  // Its push is done: an asynchronous worker pulls and goes on (a synchronous one waits for
  // the step) — after the server applied what it can, so the pull sees the worker's own update
  // unless an earlier sequence number is still on its way.
  if (p_.mode == Mode::backup) {
    arrive_for_backup_step(t.in, t.seq, t.gradients.front(), now);
    return;
  }
  const bool goes_on = t.direct && !is_synchronous(p_.mode);
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
  if (goes_on) finish_step(pusher, now);
}

void Cluster::drop_submitted(RequestId request) {
  const auto it = gradients_.find(request);
  const Gradient dropped = it->second;
  gradients_.erase(it);
  submit_time_.erase(request);
  ++stats_.drops;
  if (dropped.worker < p_.stragglers) ++stats_.straggler_drops;
  if (observer_) observer_->dropped(dropped);
}

Gradient Cluster::record_applied(RequestId request, Seq seq, Instant now) {
  const auto it = gradients_.find(request);
  Gradient g = it->second;
  gradients_.erase(it);
  g.delay = (seq - 1) - g.computed_on;
  stats_.delays.push_back(g.delay);
  ++stats_.applied;
  if (g.worker < p_.stragglers) ++stats_.straggler_applied;
  stats_.latency_sum_ms += static_cast<double>((now - submit_time_.at(request)).count()) / 1e6;
  submit_time_.erase(request);
  return g;
}

void Cluster::apply(EndpointId at, std::vector<RequestId> requests, Seq seq, Instant now) {
  scratch_.clear();
  for (const RequestId request : requests) scratch_.push_back(record_applied(request, seq, now));
  applied_[at] = seq;
  push(now + Nanos{static_cast<std::int64_t>(p_.replica_lag_us * 1e3)}, Kind::replica_ack, to_int(at) - kServerBase,
       seq);
  if (!is_synchronous(p_.mode)) {
    if (observer_) observer_->applied(scratch_, now);
    return;
  }
  // Sync: the step is applied once all N of its updates are in; then everyone pulls it.
  step_.insert(step_.end(), scratch_.begin(), scratch_.end());
  if (step_.size() == p_.workers) apply_step(now);
}

void Cluster::apply_step(Instant now) {
  ++stats_.steps;
  if (observer_) observer_->applied(step_, now);
  step_.clear();
  for (std::uint32_t w = 0; w < p_.workers; ++w) {
    Worker& worker = workers_[w];
    if (worker.computing || worker.pulling) {  // backup: a worker still on the old step drops it unsent
      ++stats_.abandoned;
      if (observer_) observer_->dropped(Gradient{RequestId{}, w, worker.computed_on, worker.token, worker.clock, 0});
    }
    worker.pulling = false;
    ++worker.clock;
    pull(w, now);
  }
}

void Cluster::arrive_for_backup_step(EndpointId at, Seq seq, RequestId request, Instant now) {
  // Arrival order decides, so the replica is acknowledged per arrival (the window only needs
  // the highest sequence number applied).
  push(now + Nanos{static_cast<std::int64_t>(p_.replica_lag_us * 1e3)}, Kind::replica_ack, to_int(at) - kServerBase,
       seq);
  applied_[at] = std::max(applied_[at], seq);
  if (gradients_.at(request).step != stats_.steps) {  // late: its step was applied without it
    drop_submitted(request);
    return;
  }
  step_.push_back(record_applied(request, seq, now));
  if (step_.size() == p_.workers - p_.backup_workers) apply_step(now);
}

void Cluster::join_ring(RequestId request, Instant now) {
  ++stats_.submitted;
  ring_ready_.push_back(request);
  if (ring_ready_.size() != p_.workers || probing_) return;
  start_round(now);
}

void Cluster::start_round(Instant now) {
  const std::vector<double> egress = workers_egress();
  const double seconds = rounds_.start_round(egress);
  push(now + Nanos{static_cast<std::int64_t>(std::llround(seconds * 1e9))}, Kind::allreduce_done, 0);
  if (skips_slowest(p_.mode) && !p_.measure_links_at_round_end) rounds_.measure(egress);
}

void Cluster::probe_links() {
  // Every worker sends probe_bytes at once while it computes; the slowest egress decides when
  // the measurement is complete. The links are read as the probe ends.
  double slowest = 0;
  for (std::uint32_t w = 0; w < p_.workers; ++w) {
    slowest = std::max(slowest, p_.ring_hop_us * 1e-6 + static_cast<double>(p_.probe_bytes) / worker_egress(w));
  }
  probing_ = true;
  push(Instant{} + Nanos{static_cast<std::int64_t>(std::llround(slowest * 1e9))}, Kind::links_probed, 0);
}

void Cluster::finish_allreduce(Instant now) {
  // The model's version is kept under server 0's name, as in sync: one version per step.
  const EndpointId at = server(0);
  const Seq seq = applied_[at] + 1;
  for (const RequestId request : ring_ready_) {
    if (rounds_.leaves_out(gradients_.at(request).worker)) {
      drop_submitted(request);  // the round did not wait for it (skip_slowest)
      continue;
    }
    step_.push_back(record_applied(request, seq, now));
  }
  ring_ready_.clear();
  if (skips_slowest(p_.mode) && p_.measure_links_at_round_end) rounds_.measure(workers_egress());
  applied_[at] = seq;
  apply_step(now);
}

}  // namespace gradlane::sched::sim
