// Cluster: a discrete-event simulation of asynchronous (or synchronous) parameter-server
// training traffic, driven through the pure scheduling core (sidecar/core). Shared by
// gradlane_sched_sim (which counts delays) and gradlane_train_sim (which trains a real model
// on the gradients as the simulation applies them, through an Observer).
//
// The model (deliberately simple, so what differs between modes is only the scheduling):
//  - N workers push one update of `bytes` to a server after each compute step of
//    `compute_ms` (uniform +-jitter), then pull the model and compute the next. The update is
//    computed on the server version current when its pull started. Pulls (PullCost): priced,
//    the default over the fair network, a pull is a transfer of `bytes` from the server's
//    egress to the worker's ingress, sharing those links like any other, and the worker
//    computes once it landed (ring's modes pay their allgather instead: no pulls); free, a
//    pull takes no time (the exclusive network always).
//  - The network (NetworkModel). fair, the default: every NIC direction is a link shared
//    max-min fairly (fair_share.hpp) by the transfers crossing it at the moment — sender
//    egress at the worker's true rate, receiver ingress at the receiver's — and the rates are
//    recomputed whenever a transfer starts or ends or a bandwidth factor changes. That is
//    what an RDMA NIC does with several writers: it interleaves them. fifo and sync then send
//    every update as soon as it is granted (the scheduler grants them all at once), as a
//    plain parameter server would; gradlane's slots still decide when its transfers begin,
//    after which they share the links like everything else in flight.
//    exclusive: every NIC direction is a serial resource: a transfer starts at max(its slot
//    start, the moment both NICs are actually free) and runs at min(true egress, true
//    ingress) alone. That holds a server's ingress for a whole update at the slower NIC's
//    rate, so a baseline whose workers are slower than the server cannot fill it.
//    In both, the scheduler only knows declared line rates and what complete() teaches it
//    (the measured duration of each transfer, from its start to its last byte).
//  - Worker egress is uneven and changes: each worker's true egress is worker_gbps times a
//    factor log-uniform in [1/spread, 1], redrawn for change_fraction of the workers every
//    change_ms; the first `stragglers` workers are further slowed by straggler_slowdown.
//  - The server applies updates in sequence order as they arrive (an aggregate is one update);
//    the replica acknowledges each replica_lag_us later (window B = replica_bound).
//  - A dropped update is never sent; its worker pulls and computes again at once.
//  - The modes. fifo: a plain asynchronous parameter server (FIFO grants, every update
//    applied on arrival, no drops, no aggregation). gradlane: the scheduling core's ordering
//    (SJF, the staleness bound tau drops, aggregation, replica window); over the fair network
//    its grants pack the server's ingress (IngressSharing::packed) unless told exclusive.
//    fifo-sa: staleness-aware asynchronous SGD (Zhang et al.): exactly fifo's traffic; only the
//    training rule differs (the Observer divides each gradient's learning rate by its delay,
//    Gradient::delay), so the cluster runs it as fifo.
//    ssp: stale-synchronous parallel with bound s (Ho et al.): fifo's traffic, but a worker's
//    clock (steps it completed: pushes done) may not run more than s ahead of the slowest
//    worker's: a worker that would start a step with clock > slowest + s waits until the
//    slowest catches up. With s beyond any lead that occurs it is fifo, event for event.
//  - Mode::sync: a barrier per step. Every worker pushes one update (FIFO order, no drops, no
//    aggregation); when all N of the step are at the server, the step is applied as one, and
//    only then do the workers pull and compute again. A step lasts until the slowest update
//    arrived. One server only.
//  - Mode::backup: synchronous SGD with b backup workers (Chen et al.). Of the `workers`
//    machines, N = workers - b are needed per step: all compute and push, and the step is
//    applied (the mean of N) as soon as N updates of that step have ARRIVED at the server
//    (arrival order, not sequence order: a straggler's earlier sequence number must not hold
//    the step). Then every worker pulls the new model and starts the next step at once: one
//    still computing abandons that computation (never sent), and an update of the old step
//    still on the wire crosses it (it was sent) and is dropped on arrival. With b = 0 it is
//    sync. One server only.
//  - Mode::ring: synchronous SGD by ring allreduce (no server). When the last worker of the
//    step has its gradient, the ring reduces and gathers it in 2(N-1) phases, each moving
//    bytes/N from every worker to the next: every link carries one flow, so a phase takes
//    ring_hop_us (a hop's fixed cost: post, completion, notify) plus bytes/N at the slowest
//    link of the ring (min over workers of its egress and its successor's ingress). Rates are
//    taken when the allreduce starts (a change during it applies to the next). Then every
//    worker has the mean and computes the next step. No server traffic at all.
//  - Mode::local: local SGD (periodic averaging; Stich; Wang & Joshi's AdaComm with a fixed
//    period). sync's traffic, but a step computes local_steps minibatches (its compute time is
//    the sum of local_steps draws) and pushes the worker's model change once: H times less
//    communication per gradient, at the price of models that drift apart between averages.
//    The Observer does the local steps and averages the models. One server only.
//  - Mode::gradlane_local: local SGD's rounds (H minibatches, then the mean of the workers'
//    models) with gradlane's traffic: each model change is granted by the scheduling core
//    (SJF, packed ingress, slots) and may be summed at an aggregator on the way, so the
//    server's ingress carries fewer than N models per round. Nothing is dropped (the round
//    needs every model), so tau does not apply. One server only.
//  - Mode::local_ring: local SGD as it is usually run (e.g. PyTorch's post-local SGD): the
//    models are averaged by ring's allreduce, with ring's timing, instead of through a server.
//  - Mode::local_tree, Mode::gradlane_tree: local SGD averaged by a pipelined tree allreduce
//    (tree_allreduce.hpp: reduce up and broadcast down at once, the same hop cost as ring's).
//    local-tree is a binary tree over the workers in a random order fixed for the run, as a
//    launcher ranks them; gradlane-tree is the scheduler's tree: each allreduce measures every
//    worker's egress and the next one puts the slowest at the leaves, where a slow link carries
//    only its own upload, not every phase (ring) or its children's streams (an inner node), and
//    gives each worker as many children as its egress carries. With skip_slowest it also does
//    not wait for that many of the slowest measured links in a round.
//  - Mode::local_ring_skip: local-ring given gradlane-tree's measurement and skip: the ring of
//    the workers not left out, then the mean sent to each left-out one. The baseline that
//    separates what the tree's placement gains from what not waiting for stragglers gains.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "perf/sched/allreduce_rounds.hpp"
#include "perf/sched/cluster_params.hpp"
#include "perf/sched/fair_share.hpp"
#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched::sim {

// One gradient as it travels: who computed it, on which server version, and the token the
// Observer handed out when its worker pulled the model it was computed on.
struct Gradient {
  RequestId request{};
  std::uint32_t worker = 0;
  Version computed_on = 0;
  std::uint64_t token = 0;
  std::uint64_t step = 0;   // its worker's clock when it pulled (barrier modes: the step)
  std::uint64_t delay = 0;  // set when applied: versions applied at its server since its pull
};

// What training needs to know. The cluster never sees parameters: the observer owns the model.
class Observer {
 public:
  virtual ~Observer() = default;
  // `worker` pulls the current model to compute its next gradient on; the returned token comes
  // back with that gradient in applied() or dropped().
  virtual std::uint64_t pulled(std::uint32_t worker) = 0;
  // One update reaches the model, in the server's apply order: one gradient, an aggregate's
  // members (to be summed), or (sync, backup) a step's gradients (to be averaged).
  virtual void applied(std::span<const Gradient> gradients, Instant now) = 0;
  // A gradient the scheduler dropped (never sent): its pulled model is no longer needed.
  virtual void dropped(const Gradient& gradient) = 0;
};

struct ClusterStats {
  std::uint64_t submitted = 0;
  std::uint64_t applied = 0;  // gradients applied (each aggregate member counts)
  std::uint64_t drops = 0;
  std::uint64_t server_slots = 0;  // sequence numbers used at the servers
  std::uint64_t aggregates = 0;
  std::uint64_t aggregated = 0;  // gradients that went through an aggregator
  std::uint64_t steps = 0;       // sync, backup: barrier steps applied
  std::uint64_t abandoned = 0;   // backup: computations dropped unsent when their step was applied
  std::uint64_t ssp_waits = 0;   // ssp: times a worker waited for the slowest before computing
  // Asynchronous modes: the largest lead of a worker's clock over the slowest worker's at the
  // moment it started computing (ssp: at most ssp_bound).
  std::uint64_t max_clock_lead = 0;
  std::vector<std::uint64_t> delays;  // per applied gradient, in server versions
  double latency_sum_ms = 0;          // submit -> applied, per applied gradient
  std::uint64_t straggler_applied = 0;
  std::uint64_t straggler_drops = 0;
  std::uint64_t rounds_by_ring = 0;  // gradlane-tree, adaptive: allreduces it ran as a ring
  double server_busy_ms = 0;         // summed over servers: time their ingress carried any transfer
  // Bytes that crossed a server's ingress. fair: as they cross (up to now); exclusive: a whole
  // transfer's when it starts.
  Bytes server_ingress_bytes = 0;
  Bytes server_egress_bytes = 0;            // pulls, as they cross (priced pulls only)
  std::uint64_t pulls = 0;                  // priced pulls that landed
  std::size_t peak_pending_aggregates = 0;  // formed, not yet granted a server slot
  std::uint64_t schedule_calls = 0;
};

// The share of the servers' ingress line rate that carried bytes over `elapsed_ms`:
// server_ingress_bytes / (servers x server line rate x elapsed). Unlike server_busy_ms, a link
// carrying one transfer at a tenth of its rate counts as a tenth used.
double server_ingress_byte_utilisation(const ClusterParams& params, const ClusterStats& stats, double elapsed_ms);

class Cluster {
 public:
  // Throws std::invalid_argument with validate()'s message. `observer` may be null (no
  // training: only the traffic is simulated); it must outlive the cluster.
  explicit Cluster(const ClusterParams& params, Observer* observer = nullptr);

  // Processes every event up to and including `end` (simulated time since the start).
  void run_until(Instant end);
  Instant now() const { return now_; }
  const ClusterStats& stats();
  const ClusterParams& params() const { return p_; }

 private:
  enum class Kind {
    compute_done,
    transfer_start,  // fair: a transfer's slot begins
    transfer_done,   // exclusive: a transfer's last byte arrives
    wire_done,       // fair: the first transfer on the wire to end, as of the last reshare
    replica_ack,
    wake,
    bandwidth_change,
    allreduce_done,  // ring: the step's allreduce finished
    links_probed,    // skipping modes: the probe before the first round ended
  };
  struct Event {
    Instant at;
    std::uint64_t order;  // FIFO among equal times: deterministic
    Kind kind;
    std::uint64_t a;  // worker index / transfer id / server index / wire generation
    std::uint64_t b;  // seq for acks
    bool operator>(const Event& o) const { return std::tie(at, order) > std::tie(o.at, o.order); }
  };
  struct Worker {
    Version computed_on = 0;
    std::uint64_t token = 0;
    std::uint64_t clock = 0;  // steps completed (asynchronous: pushes done or dropped)
    bool computing = false;
    bool pulling = false;  // a priced pull is on the wire; it computes when it lands
  };
  struct Transfer {
    EndpointId out, in;
    std::uint64_t aggregate = 0;  // for member transfers: the aggregate it feeds
    bool to_server = false;
    bool direct = false;  // a worker's own update straight to the server
    Seq seq = 0;
    Bytes bytes = 0;
    std::vector<RequestId> gradients;
    bool pull = false;  // the model from the server's egress to worker `puller`
    std::uint32_t puller = 0;
    std::uint64_t clock = 0;  // pulls: the worker's clock when it began (a later step voids it)
  };
  struct WireFlow {  // fair: a transfer on the wire
    std::uint64_t transfer = 0;
    std::uint32_t egress_link = 0;  // link keys (see wire_ below)
    std::uint32_t ingress_link = 0;
    std::optional<std::uint32_t> server;  // the server whose ingress it enters, if any
    bool pull = false;                    // leaves a server's egress (counted as egress bytes)
    double remaining = 0;                 // bytes, as of wire_clock_
    double rate = 0;                      // bytes per second, since the last reshare
  };
  struct Pending {  // an aggregate being collected
    std::size_t expected = 0;
    std::size_t arrived = 0;
    Instant last_arrival{};
    std::optional<AggregateGrant> grant;
  };

  static constexpr std::uint32_t kServerBase = 1'000'000;  // servers' endpoint ids from here on
  static EndpointId worker(std::uint32_t w) { return EndpointId{w + 1}; }
  static EndpointId server(std::uint32_t s);

  void push(Instant at, Kind kind, std::uint64_t a, std::uint64_t b = 0);
  // A worker needs the current model to compute on: it pulls it (priced) or has it at once.
  void pull(std::uint32_t w, Instant now);
  bool prices_pulls() const;
  // The model the worker computes on is the one current now (its token from the Observer).
  void take_snapshot(std::uint32_t w);
  void start_compute(std::uint32_t w, Instant now);
  void finish_pull(const Transfer& t, Instant now);
  void handle(const Event& e, Instant now);
  void decide(Instant now);
  void start(std::uint64_t id, Transfer t, Instant slot_start, Instant now);
  void start_exclusive(std::uint64_t id, Transfer t, Instant slot_start, Instant now);
  // The fair model's wire: transfers enter and leave it; advance_wire() moves their bytes on at
  // the current rates; reshare() computes new rates and schedules the next wire_done.
  void put_on_wire(std::uint64_t id, Instant now);
  void advance_wire(Instant now);
  void reshare(Instant now);
  void finish_due_flows(Instant now);
  std::uint32_t link_key_of_ingress(EndpointId receiver) const;
  double link_capacity(std::uint32_t key) const;
  void launch_aggregate(std::uint64_t aggregate, Instant now);
  void finish_transfer(std::uint64_t id, Instant now);
  void apply(EndpointId at, std::vector<RequestId> requests, Seq seq, Instant now);
  // Takes a submitted gradient out of the books as dropped (never applied) and tells the Observer.
  void drop_submitted(RequestId request);
  // Takes a submitted gradient out of the books as applied at `seq`, counting its delay.
  Gradient record_applied(RequestId request, Seq seq, Instant now);
  // Asynchronous modes: worker w's step is over (pushed or dropped): its clock advances and it
  // computes the next, unless ssp makes it wait for the slowest.
  void finish_step(std::uint32_t w, Instant now);
  void start_waiting_workers(Instant now);
  std::uint64_t slowest_clock() const { return clock_counts_.begin()->first; }
  // Barrier modes: step_ is applied as one update and every worker starts the next step.
  void apply_step(Instant now);
  // backup: a direct update reached the server: counted for its step, or dropped if late.
  void arrive_for_backup_step(EndpointId at, Seq seq, RequestId request, Instant now);
  // ring: worker w's gradient is ready; the last of the step starts the allreduce.
  void join_ring(RequestId request, Instant now);
  void start_round(Instant now);  // allreduce modes: every gradient of the step is ready
  void probe_links();             // skipping modes, probe_bytes: the first measurement
  void finish_allreduce(Instant now);
  void change_bandwidth(Instant now);
  double draw_factor();
  double worker_egress(std::uint32_t w) const;
  std::vector<double> workers_egress() const;  // every worker's, now

  ClusterParams p_;
  Observer* observer_;
  std::mt19937_64 rng_;      // compute times
  std::mt19937_64 net_rng_;  // bandwidth factors: apart, so uneven links do not shift compute times
  std::optional<Scheduler> scheduler_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t order_ = 0;
  std::uint64_t next_request_ = 1;
  Instant now_{};
  std::vector<Worker> workers_;
  std::vector<double> factor_;  // per worker: true egress / declared
  std::map<EndpointId, double> true_in_;
  std::map<EndpointId, Instant> busy_out_, busy_in_;
  std::map<EndpointId, Version> applied_;
  std::map<EndpointId, Seq> next_apply_;
  std::map<EndpointId, std::map<Seq, std::vector<RequestId>>> arrived_;
  std::map<RequestId, Gradient> gradients_;  // submitted, not yet applied or dropped
  std::map<RequestId, Instant> submit_time_;
  std::map<std::uint64_t, Transfer> transfers_;
  std::map<std::uint64_t, Instant> begins_;
  std::map<std::uint64_t, Pending> pending_;
  std::vector<Gradient> step_;         // barrier modes: the gradients of the current step at the server
  std::vector<RequestId> ring_ready_;  // allreduce modes: the step's gradients computed so far
  AllreduceRounds rounds_;             // allreduce modes: each round's shape, whom it leaves out, its price
  bool probing_ = false;               // skipping modes: the first round waits for the probe
  // Asynchronous modes: how many workers are at each clock (the first key is the slowest), and
  // (ssp) the workers waiting for the slowest to catch up, by their clock.
  std::map<std::uint64_t, std::uint32_t> clock_counts_;
  std::map<std::uint64_t, std::vector<std::uint32_t>> waiting_by_clock_;
  // Fair model. Link keys: worker w's egress is w, server s's ingress workers + s, worker w's
  // ingress (as an aggregator, or pulling) workers + servers + w, server s's egress
  // 2 workers + servers + s.
  std::vector<WireFlow> wire_;
  FairShare fair_share_;
  std::vector<std::int64_t> link_index_;     // per link key: its index in fair_share_, or -1
  std::vector<std::uint32_t> used_links_;    // keys set in link_index_ by the last reshare
  std::vector<std::uint32_t> server_flows_;  // per server: transfers on the wire into it
  std::uint32_t busy_servers_ = 0;           // servers with any
  Instant wire_clock_{};                     // WireFlow::remaining is as of this instant
  std::uint64_t wire_generation_ = 0;        // a wire_done of an older reshare is stale
  bool wire_changed_ = false;                // a transfer entered or left, or a rate changed
  double server_bytes_carried_ = 0;
  double server_bytes_sent_ = 0;  // pulls out of the servers' egress
  std::uint64_t next_pull_ = 0;
  std::optional<Instant> scheduled_wake_;
  std::vector<Outcome> out_;
  std::vector<Gradient> scratch_;
  ClusterStats stats_;
};

}  // namespace gradlane::sched::sim
