#include "perf/sched/cluster.hpp"

#include "perf/sched/tree_allreduce.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <variant>

namespace gradlane::sched::sim {
namespace {

constexpr std::uint32_t kServerBase = 1'000'000;
constexpr double kGbps = 1e9 / 8;  // bytes per second in one Gb/s

Nanos from_ms(double ms) { return Nanos{static_cast<std::int64_t>(ms * 1e6)}; }

// fair: fifo and sync are granted everything at once (a plain parameter server has every
// worker write as soon as its update is ready), so their grant horizon is longer than any run.
constexpr Nanos kGrantAtOnce = std::chrono::hours{24 * 365};

// Pulls are transfers of the cluster's own, never the scheduler's: their ids start here.
constexpr std::uint64_t kPullIdBase = std::uint64_t{1} << 62;

}  // namespace

const char* to_string(Mode mode) {
  switch (mode) {
    case Mode::fifo:
      return "fifo";
    case Mode::gradlane:
      return "gradlane";
    case Mode::sync:
      return "sync";
    case Mode::fifo_sa:
      return "fifo-sa";
    case Mode::backup:
      return "backup";
    case Mode::ssp:
      return "ssp";
    case Mode::ring:
      return "ring";
    case Mode::local:
      return "local";
    case Mode::gradlane_local:
      return "gradlane-local";
    case Mode::local_ring:
      return "local-ring";
    case Mode::local_tree:
      return "local-tree";
    case Mode::gradlane_tree:
      return "gradlane-tree";
    case Mode::local_ring_skip:
      return "local-ring-skip";
  }
  return "?";
}

Mode parse_mode(const std::string& name) {
  if (name == "fifo") return Mode::fifo;
  if (name == "gradlane") return Mode::gradlane;
  if (name == "sync") return Mode::sync;
  if (name == "fifo-sa") return Mode::fifo_sa;
  if (name == "backup") return Mode::backup;
  if (name == "ssp") return Mode::ssp;
  if (name == "ring") return Mode::ring;
  if (name == "local") return Mode::local;
  if (name == "gradlane-local") return Mode::gradlane_local;
  if (name == "local-ring") return Mode::local_ring;
  if (name == "local-tree") return Mode::local_tree;
  if (name == "gradlane-tree") return Mode::gradlane_tree;
  if (name == "local-ring-skip") return Mode::local_ring_skip;
  throw std::invalid_argument("unknown mode '" + name +
                              "': use gradlane, fifo, sync, fifo-sa, backup, ssp, ring, local, local-ring, "
                              "local-ring-skip, local-tree, gradlane-local or gradlane-tree");
}

bool is_synchronous(Mode mode) {
  return mode == Mode::sync || mode == Mode::backup || allreduces(mode) || averages_models(mode);
}

bool averages_models(Mode mode) {
  return mode == Mode::local || mode == Mode::local_ring || mode == Mode::local_ring_skip || mode == Mode::local_tree ||
         mode == Mode::gradlane_local || mode == Mode::gradlane_tree;
}

bool allreduces(Mode mode) {
  return mode == Mode::ring || mode == Mode::local_ring || mode == Mode::local_ring_skip || mode == Mode::local_tree ||
         mode == Mode::gradlane_tree;
}

bool skips_slowest(Mode mode) { return mode == Mode::gradlane_tree || mode == Mode::local_ring_skip; }

bool reduces_by_tree(Mode mode) { return mode == Mode::local_tree || mode == Mode::gradlane_tree; }

bool uses_gradlane_grants(Mode mode) { return mode == Mode::gradlane || mode == Mode::gradlane_local; }

const char* to_string(NetworkModel network) {
  switch (network) {
    case NetworkModel::fair:
      return "fair";
    case NetworkModel::exclusive:
      return "exclusive";
  }
  return "?";
}

NetworkModel parse_network_model(const std::string& name) {
  if (name == "fair") return NetworkModel::fair;
  if (name == "exclusive") return NetworkModel::exclusive;
  throw std::invalid_argument("unknown network model '" + name + "': use fair or exclusive");
}

const char* to_string(IngressSharing ingress) { return ingress == IngressSharing::packed ? "packed" : "exclusive"; }

IngressSharing parse_ingress_sharing(const std::string& name) {
  if (name == "packed") return IngressSharing::packed;
  if (name == "exclusive") return IngressSharing::exclusive;
  throw std::invalid_argument("unknown ingress sharing '" + name + "': use packed or exclusive");
}

const char* to_string(PullCost pulls) { return pulls == PullCost::priced ? "priced" : "free"; }

PullCost parse_pull_cost(const std::string& name) {
  if (name == "priced") return PullCost::priced;
  if (name == "free") return PullCost::free;
  throw std::invalid_argument("unknown pull cost '" + name + "': use priced or free");
}

double server_ingress_byte_utilisation(const ClusterParams& p, const ClusterStats& s, double elapsed_ms) {
  if (!(elapsed_ms > 0)) return 0.0;
  const double line_bytes = p.server_gbps * kGbps * p.servers * elapsed_ms / 1e3;
  return static_cast<double>(s.server_ingress_bytes) / line_bytes;
}

std::optional<std::string> ClusterParams::validate() const {
  if (workers == 0) return "workers must be at least 1";
  if (servers == 0) return "servers must be at least 1";
  if (stragglers > workers) return "stragglers cannot exceed workers";
  if (is_synchronous(mode) && servers != 1)
    return "sync, backup, ring and local modes simulate one server (ring: its version)";
  if (allreduces(mode) && !(ring_hop_us >= 0)) return "ring hop cost must be >= 0";
  if (averages_models(mode) && local_steps == 0) return "local SGD needs at least 1 local step per average";
  if (mode == Mode::backup && backup_workers >= workers) return "backup workers must be fewer than workers";
  if (skip_slowest > 0 && !skips_slowest(mode)) return "only gradlane-tree and local-ring-skip skip the slowest links";
  if (skip_slowest >= workers) return "skip fewer of the slowest links than there are workers";
  if (mode == Mode::gradlane_tree && 2 * (std::uint64_t{workers} - skip_slowest) + 1 < workers) {
    return "gradlane-tree can skip at most half the workers (those it skips are leaves)";
  }
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
  if (reduces_by_tree(p.mode)) {  // ranks in an order the rates do not know: a random one, fixed
    tree_order_.resize(p.workers);
    std::iota(tree_order_.begin(), tree_order_.end(), 0U);
    std::mt19937_64 placement(p.seed ^ 0x5bd1e995ULL);
    std::shuffle(tree_order_.begin(), tree_order_.end(), placement);
  }
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

std::uint32_t Cluster::link_key_of_ingress(EndpointId receiver) const {
  const std::uint32_t id = to_int(receiver);
  return id >= kServerBase ? p_.workers + (id - kServerBase) : p_.workers + p_.servers + (id - 1);
}

double Cluster::link_capacity(std::uint32_t key) const {
  if (key < p_.workers) return worker_egress(key);
  if (key < p_.workers + p_.servers) return true_in_.at(server(key - p_.workers));
  if (key < 2 * p_.workers + p_.servers) return true_in_.at(worker(key - p_.workers - p_.servers));
  return p_.server_gbps * kGbps;  // a server's egress: its line rate, as its ingress
}

void Cluster::put_on_wire(std::uint64_t id, Instant now) {
  advance_wire(now);  // the bytes so far moved at the rates without this transfer
  const Transfer& t = transfers_.at(id);
  WireFlow f;
  f.transfer = id;
  // Workers send updates (aggregators are workers); servers send only pulls.
  f.egress_link = t.pull ? 2 * p_.workers + p_.servers + (to_int(t.out) - kServerBase) : to_int(t.out) - 1;
  f.ingress_link = link_key_of_ingress(t.in);
  f.pull = t.pull;
  if (t.to_server) {
    f.server = to_int(t.in) - kServerBase;
    if (server_flows_[*f.server]++ == 0) ++busy_servers_;
  }
  f.remaining = static_cast<double>(t.bytes);
  wire_.push_back(f);
  begins_[id] = now;
  wire_changed_ = true;
}

void Cluster::advance_wire(Instant now) {
  if (now <= wire_clock_) return;
  const double seconds = static_cast<double>((now - wire_clock_).count()) / 1e9;
  wire_clock_ = now;
  for (WireFlow& f : wire_) {
    // A flow never carries more than it has left (its end is rounded up to a whole ns).
    const double carried = std::min(f.rate * seconds, std::max(0.0, f.remaining));
    f.remaining -= carried;
    if (f.server) server_bytes_carried_ += carried;
    if (f.pull) server_bytes_sent_ += carried;
  }
  stats_.server_busy_ms += busy_servers_ * seconds * 1e3;
}

void Cluster::reshare(Instant now) {
  wire_changed_ = false;
  ++wire_generation_;  // whatever wire_done is queued was computed on the old rates
  fair_share_.clear();
  for (const std::uint32_t key : used_links_) link_index_[key] = -1;
  used_links_.clear();
  const auto index_of = [&](std::uint32_t key) {
    if (link_index_[key] < 0) {
      link_index_[key] = fair_share_.add_link(link_capacity(key));
      used_links_.push_back(key);
    }
    return static_cast<std::uint32_t>(link_index_[key]);
  };
  for (const WireFlow& f : wire_) {
    const std::uint32_t links[] = {index_of(f.egress_link), index_of(f.ingress_link)};
    fair_share_.add_flow(links);
  }
  const std::vector<double>& rates = fair_share_.solve();
  std::optional<double> first_end_ns;
  for (std::size_t i = 0; i < wire_.size(); ++i) {
    wire_[i].rate = rates[i];
    if (rates[i] <= 0) continue;
    const double end_ns = std::max(0.0, wire_[i].remaining) / rates[i] * 1e9;
    if (!first_end_ns || end_ns < *first_end_ns) first_end_ns = end_ns;
  }
  // Rounded up, and at least 1 ns: when it fires, that transfer has no bytes left.
  if (first_end_ns) {
    const auto ns = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(*first_end_ns)));
    push(now + Nanos{ns}, Kind::wire_done, wire_generation_);
  }
}

void Cluster::finish_due_flows(Instant now) {
  advance_wire(now);
  wire_changed_ = true;  // even if rounding left every flow a hair short: reshare reschedules
  std::vector<std::uint64_t> done;
  std::erase_if(wire_, [&](const WireFlow& f) {
    // What is left would cross within the nanosecond this event was rounded to (or rounding).
    if (f.remaining > f.rate * 1e-9 + 1e-6) return false;
    if (f.server && --server_flows_[*f.server] == 0) --busy_servers_;
    done.push_back(f.transfer);
    return true;
  });
  for (const std::uint64_t id : done) finish_transfer(id, now);
}

void Cluster::start_exclusive(std::uint64_t id, Transfer t, Instant slot_start, Instant now) {
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
  if (ring_ready_.size() != p_.workers) return;
  if (skips_slowest(p_.mode)) {  // the last measurement decides whom this round leaves out
    skipped_this_round_ = links_measured_ ? next_skipped_ : std::vector<bool>(p_.workers, false);
    skipped_count_ = links_measured_ ? p_.skip_slowest : 0;
  }
  push(now + allreduce_time(), Kind::allreduce_done, 0);
  if (skips_slowest(p_.mode)) measure_links();
}

void Cluster::measure_links() {
  // Every worker's egress as this allreduce starts: an oracle for what a scheduler probing the
  // links between rounds would read (the same for gradlane-tree and local-ring-skip).
  std::vector<double> measured(p_.workers);
  for (std::uint32_t w = 0; w < p_.workers; ++w) measured[w] = worker_egress(w);
  const std::vector<std::uint32_t> fastest_first = place_slowest_at_leaves(measured);
  next_skipped_.assign(p_.workers, false);
  for (std::size_t i = p_.workers - p_.skip_slowest; i < p_.workers; ++i) next_skipped_[fastest_first[i]] = true;
  if (p_.mode == Mode::gradlane_tree) tree_order_ = fastest_first;  // the slowest at the leaves
  links_measured_ = true;
}

std::size_t Cluster::uploaders() const { return p_.workers - skipped_count_; }

Nanos Cluster::allreduce_time() const {
  if (p_.workers == 1) return Nanos{0};
  if (reduces_by_tree(p_.mode)) {
    std::vector<double> egress(p_.workers), ingress(p_.workers, p_.worker_gbps * kGbps);
    for (std::size_t i = 0; i < p_.workers; ++i) egress[i] = worker_egress(tree_order_[i]);
    const double s =
        tree_allreduce_seconds(egress, ingress, static_cast<double>(p_.bytes), p_.ring_hop_us * 1e-6, uploaders());
    return Nanos{static_cast<std::int64_t>(std::llround(s * 1e9))};
  }
  // local-ring-skip: the ring is the workers not left out; each left-out one then receives the
  // mean from a distinct ring member, the fastest ones, all at once.
  const double ingress = p_.worker_gbps * kGbps;  // every worker's
  double slowest = ingress;
  std::vector<double> members;
  for (std::uint32_t w = 0; w < p_.workers; ++w) {
    if (!skipped_this_round_.empty() && skipped_this_round_[w]) continue;
    slowest = std::min(slowest, worker_egress(w));
    members.push_back(worker_egress(w));
  }
  const auto n = static_cast<double>(members.size());
  const double hop = p_.ring_hop_us * 1e-6, bytes = static_cast<double>(p_.bytes);
  double seconds = n > 1 ? 2 * (n - 1) * (hop + bytes / n / slowest) : 0.0;
  if (skipped_count_ > 0) {
    std::sort(members.begin(), members.end(), std::greater<>());
    seconds += hop + bytes / std::min(members[std::min(skipped_count_, members.size()) - 1], ingress);
  }
  return Nanos{static_cast<std::int64_t>(std::llround(seconds * 1e9))};
}

void Cluster::finish_allreduce(Instant now) {
  // The model's version is kept under server 0's name, as in sync: one version per step.
  const EndpointId at = server(0);
  const Seq seq = applied_[at] + 1;
  for (const RequestId request : ring_ready_) {
    if (!skipped_this_round_.empty() && skipped_this_round_[gradients_.at(request).worker]) {
      drop_submitted(request);  // the round did not wait for it (skip_slowest)
      continue;
    }
    step_.push_back(record_applied(request, seq, now));
  }
  ring_ready_.clear();
  applied_[at] = seq;
  apply_step(now);
}

}  // namespace gradlane::sched::sim
