// Scheduler: the scheduling core of the sidecar, as one deterministic state machine.
//
// Inputs are explicit calls with the time passed in; outputs are Outcomes (outcome.hpp):
//   submit(request, now)      an application asks to send a gradient (batched until schedule)
//   schedule(now)             one batch decision: grants, redirects, drops, aggregate grants
//   complete(transfer, now, measured)   a granted transfer finished (feeds bandwidth + credit)
//   replica_ack(server, seq)  the replica applied everything up to seq (opens the window B)
//
// One schedule() pass, MLfabric's iterative ordering (seed 000):
//   1. Each sender NIC offers one candidate: its head part, chosen by its TenantArbiter (job
//      by shortest-remaining-job-first with a no-starvation floor, then layer priority, P3).
//      A NIC whose bytes in flight would exceed the credit offers nothing this pass.
//   2. Of all candidates, the one that would *finish* first goes next: start = max(now, the
//      sender's egress tail, the receiver's ingress tail), finish = start + bytes / min(egress
//      estimate, ingress estimate). That is shortest-job-first, network-aware: a straggler's
//      slow egress makes its update a long job. Ties: larger gradient norm, then request id.
//      (Ordering::fifo instead takes the lowest request id: the baseline.)
//   3. Before that, any candidate that would exceed the staleness bound tau even if applied
//      next is dropped, with the rest of its request (staleness.hpp): it never crosses the
//      network and its sender is told. Nothing is dropped for any other reason.
//   4. The winner gets the server's next sequence number, unless that would run more than B
//      ahead of the replica's ack (replication_window.hpp); that server then waits.
//   5. After a direct grant, other candidates with the same (job, server, tensor, part) that
//      would now wait for the server are grouped and redirected to an aggregator
//      (aggregation.hpp); the aggregate becomes a candidate of its own, with the server keeping a
//      sequence number free for it by its deadline (DeadlineReservations), so a redirected
//      update is never dropped after crossing the network.
//   6. Repeat until no candidate can start within now + grant_horizon.
//
// Cost: candidates (one per busy sender NIC, plus pending aggregates) are indexed per
// receiver in the order of their duration and then the tie-break (CandidateTable,
// candidate_table.hpp). A transfer starts no earlier
// than its receiver is free (T), so T + duration bounds its finish from below, and a decision
// stops reading a receiver's index once that bound, with the candidate's tie-break, loses to
// the best found: typically a few candidates and O(log pending) upkeep, not all of them. FIFO reads up to the
// first candidate that can start. Hopeless parts come from a per-receiver deadline index.
// Measured by perf/sched (gradlane_sched_bench); SchedulerConfig::check_scan cross-checks every
// decision against a scan of all candidates.
//
// Time. Slot times are on the caller's timeline: the daemon passes its CLOCK_MONOTONIC as
// `now`, and a grant's slot.start is the moment on that same clock the transfer should begin.
// A peer on another host is told (slot.start - now) as a relative delay, never the instant.
// `now` passed to schedule()/complete() must not go backwards; a smaller value is treated
// as the latest seen.
//
// Feeding completions. Call complete() once per Grant/Redirect/AggregateGrant transfer when
// its last byte is known placed (the WRITE_WITH_IMM completion), with the measured wire time
// (post to completion). It returns the credit, refines the bandwidth estimates, and, if the
// transfer ended before its slot did, gives the rest of the slot back (used_slot()). A failed
// transfer (TransferResult::failed) still returns its credit but keeps its whole slot (nothing
// proves its bytes stopped arriving); its sequence number stays consumed, and
// the next schedule() emits a Cancel of it for the receiver, so the server and the replica
// skip it in order instead of waiting for a write that will never come.
//
// Not thread-safe by design (no threads in the core): the daemon owns one Scheduler per
// scheduling domain and calls it from one thread. When to call schedule(): after submit(),
// complete() and replica_ack() (each can unblock work) and at next_wakeup().
//
// Design decisions (where this goes beyond or departs from the design brief, and why):
//  - Version == sequence number. Each server applies updates strictly in sequence order and
//    every update or aggregate is one version, so the version a grant is applied to is known
//    exactly when the sequence number is assigned: staleness is checked, not predicted.
//  - A request's own earlier parts do not count as staleness (staleness.hpp); otherwise
//    partitioning (needed for P3 priority) and a small tau could not coexist.
//  - An aggregate is not booked at the server when its group forms. It becomes a candidate
//    once its sum can be ready, so the server serves others while members travel to the
//    aggregator; an earliest-deadline-first reservation keeps a version free for it, so a
//    redirected update is never dropped after it crossed the network.
//  - The aggregator is chosen by predicted completion among those with spare bandwidth (it
//    can collect the group no later than the server could), not at random as in MLfabric:
//    reproducible, and never a straggler. Members and the server itself never aggregate.
//  - Timelines are append-only (slot_book.hpp): slot order = sequence order = apply order.
//  - A sender NIC sends in its arbiter's strict order (tenant, then layer priority): the next
//    part waits for a busy server even if another server is idle. That is the P3 semantics
//    (earlier layers first); it costs head-of-line blocking across servers.
//  - Credit is per NIC (not per job); an aggregator forwarding others' updates is not charged.
//  - Slots are exclusive at a receiver by default, as the brief asks (no overlap). A server
//    whose NIC is k times faster than its workers' then uses 1/k of it: 25 Gb/s workers into a
//    100 Gb/s server reach 25%. IngressSharing::packed lifts that: each grant carries the share
//    of the receiver's line rate its path can use, and grants whose shares fit run at once
//    (ingress_shares.hpp). Starts still follow sequence order; arrivals may not, and a server
//    applies in sequence order anyway. Under packed, the pick itself never joins a group
//    (aggregation.pick_joins): it starts as soon as its share is free, so nothing waits behind it.
//  - Bandwidth learning believes gross slowdowns at once and blames the sender on a tie
//    (bandwidth.hpp), so one straggler neither overruns its slots nor slows a healthy server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "sidecar/core/bandwidth.hpp"
#include "sidecar/core/candidate_table.hpp"
#include "sidecar/core/config.hpp"
#include "sidecar/core/ingress_shares.hpp"
#include "sidecar/core/outcome.hpp"
#include "sidecar/core/partition.hpp"
#include "sidecar/core/replication_window.hpp"
#include "sidecar/core/slot_book.hpp"
#include "sidecar/core/staleness.hpp"
#include "sidecar/core/tenant_arbiter.hpp"
#include "sidecar/core/types.hpp"

namespace gradlane::sched {

enum class SubmitStatus : std::uint8_t {
  accepted,
  empty_request,            // bytes == 0
  sender_is_receiver,       // a NIC cannot be both ends of a transfer
  duplicate_id,             // a request with this id is still pending
  version_from_future,      // computed_on is ahead of the server (re-pull: the server restarted?)
  receiver_of_another_job,  // the receiver's server serves another job (serve_job)
  // The two below are a Policy's, never the Scheduler's (it serves every receiver it is asked
  // about). A sidecar with peers knows which sidecar owns each receiver's sequence:
  receiver_unreachable,  // its owner is a peer whose link failed: scheduling it here too would
                         // let two sidecars hand out the same sequence number
  unknown_receiver,      // no sidecar (neither this one nor a peer) serves that endpoint
};

// ok: the transfer is known finished (its last byte placed). failed: it did not complete (its
// sender says so, or its app died). sender_lost: nobody will ever say — its sender's sidecar
// was lost, while the sender itself may live and still be writing (Cancel::sender_may_write).
enum class TransferResult : std::uint8_t { ok, failed, sender_lost };

// The part of `planned` a finished transfer used on its NICs: up to `at` when it is known to
// have ended early, all of it otherwise. A failure report does not prove the link idle — a
// sender whose sidecar was lost may still be writing until its slot ends — so only a
// transfer that completed gives back the rest of its slot. Never before the slot's start.
constexpr Slot used_slot(const Slot& planned, Instant at, TransferResult result) noexcept {
  if (result != TransferResult::ok || at >= planned.end) return planned;
  return Slot{planned.start, at > planned.start ? at : planned.start};
}

// A granted transfer still waiting for its complete() (see Scheduler::transfer()).
struct TransferView {
  EndpointId sender{};    // the NIC the bytes leave from (an aggregator for an AggregateGrant)
  EndpointId receiver{};  // the server, or the aggregator of a Redirect
  Bytes bytes = 0;
  Slot slot{};  // as granted
  Seq seq = 0;  // the sequence it carries at the receiver (0: a Redirect)
  JobId job{};
};

struct SchedulerStats {
  std::uint64_t requests = 0;    // accepted
  std::uint64_t parts = 0;       // parts of accepted requests
  std::uint64_t grants = 0;      // parts sent straight to a server
  std::uint64_t redirects = 0;   // parts sent to an aggregator
  std::uint64_t aggregates = 0;  // aggregates granted a server slot
  std::uint64_t drops = 0;       // parts dropped (staleness bound)
  std::uint64_t decisions = 0;   // grants + redirects + drops + aggregates
};

class Scheduler {
 public:
  // Throws std::invalid_argument with SchedulerConfig::validate()'s message on a bad config.
  explicit Scheduler(SchedulerConfig config = {});

  // --- setup (all optional) ---
  // Declares a NIC's rate (its line rate), replacing the estimate until transfers refine it.
  void set_rate(EndpointId endpoint, Direction direction, double bytes_per_sec);
  // Starts a server's sequence at `current` (e.g. a replica taking over at its version).
  // Only before the first sequence number for that server is granted (or after
  // close_receiver()); returns false otherwise.
  bool open_receiver(EndpointId receiver, Version current);
  // The receiver's sequence is no longer this scheduler's (its server failed over to a replica
  // another sidecar schedules, or to one here that restarts the sequence): every part pending
  // for it is dropped now (appended to `out`, DropReason::receiver_moved), its pending
  // aggregates are forgotten (their members were already redirected; the aggregator never
  // gets a grant for them), its granted transfers no longer cancel a sequence when they fail
  // (the sequence belongs to the old server), and open_receiver() may start it again.
  // Returns the number of aggregates forgotten.
  std::size_t close_receiver(EndpointId receiver, std::vector<Outcome>& out);
  // The receiver's server writes updates into `slots` reused slots: its sequence is never
  // granted more than `slots` past what it acknowledged (replica_ack), replica or not — a
  // window of min(B, slots). Without it a grant could run past the slots (a slow server
  // ingress, no replica window) and its write land in the slot of an update not yet applied.
  // Kept across close_receiver()/open_receiver(); a later call may only narrow it.
  void limit_window(EndpointId receiver, std::uint64_t slots);
  // Nothing is granted to the receiver until open_receiver(): its server is alive and its
  // sequence went on under a sidecar that died; this one must not hand out a number (and a
  // slot, sequence % slots, that may hold an update not yet applied) before the server says
  // from where on (it attaches taking its own sequence over). Requests for it wait.
  void hold_receiver(EndpointId receiver);
  // The receiver's server is an app of `job`: requests of other jobs for it are refused
  // (receiver_of_another_job). Each sequence number it hands out is a slot its server waits
  // for, so a request of a job that cannot write there leaves a hole. nullopt: any job again
  // (its server left). Requests already queued are not touched.
  void serve_job(EndpointId receiver, std::optional<JobId> job);
  // `endpoint` may aggregate updates of `job` (it registered aggregation regions).
  void add_aggregator(JobId job, EndpointId endpoint);
  void remove_aggregator(JobId job, EndpointId endpoint);

  // --- inputs ---
  [[nodiscard]] SubmitStatus submit(const Request& request, Instant now);
  std::vector<Outcome> schedule(Instant now);
  void schedule(Instant now, std::vector<Outcome>& out);  // appends to `out`
  // Returns false for an unknown (or already completed) transfer id.
  bool complete(TransferId transfer, Instant now, Nanos measured, TransferResult result = TransferResult::ok);
  // Returns false if `seq` was never granted at that server (a protocol error; ignored).
  bool replica_ack(EndpointId receiver, Seq seq);
  // A receiver's ingress under IngressSharing::packed (nullptr for a NIC never seen).
  const IngressShares* ingress_shares(EndpointId endpoint) const;
  // A granted transfer not yet complete()d (nullopt: unknown or already completed). Lets a
  // caller record what complete() is about to release (the schedule log's completion line).
  std::optional<TransferView> transfer(TransferId transfer) const;
  // A transfer the scheduler did not grant (e.g. a model pull) also measures the path.
  void observe_transfer(EndpointId sender, EndpointId receiver, Bytes bytes, Nanos duration);

  // --- inspection ---
  // The version the server reaches once every update granted so far is applied; the next
  // grant is applied to this version. Staleness is computed against it.
  Version server_version(EndpointId receiver) const;
  Seq replica_acked(EndpointId receiver) const;
  // The job serve_job() last named for the receiver (nullopt: any job, or never named).
  std::optional<JobId> served_job(EndpointId receiver) const;
  // Bytes granted from this NIC's own requests and not yet completed (<= credit, or one part).
  Bytes in_flight(EndpointId endpoint) const;
  // When pending work next fits in the grant horizon, if the last schedule() left some that
  // only the horizon held back. Work held by credit or the replica window waits for
  // complete() or replica_ack() instead; call schedule() after those.
  std::optional<Instant> next_wakeup() const noexcept { return wake_; }
  std::size_t pending_parts() const noexcept { return pending_parts_; }
  std::size_t pending_aggregates() const noexcept { return aggregates_.size(); }
  // Timelines (nullptr for a NIC the scheduler has never seen).
  const SlotBook* ingress(EndpointId endpoint) const;
  const SlotBook* egress(EndpointId endpoint) const;
  const BandwidthEstimator& bandwidth() const noexcept { return bandwidth_; }
  const SchedulerStats& stats() const noexcept { return stats_; }
  const SchedulerConfig& config() const noexcept { return config_; }

 private:
  using Index = std::uint32_t;  // dense endpoint index
  static constexpr std::int32_t kNone = -1;

  struct EndpointState {
    EndpointId id{};
    SlotBook egress;
    SlotBook ingress;
    IngressShares shares;                     // the same ingress under IngressSharing::packed (see ingress_free())
    TenantArbiter queue;                      // as a sender: its queued parts
    std::int32_t head = kNone;                // candidate offering queue.head()
    ReplicationWindow window;                 // as a server
    DeadlineReservations reservations;        // as a server: pending aggregates' deadlines
    bool sequenced = false;                   // a sequence number was granted here
    std::optional<std::uint64_t> slot_limit;  // as a server: its slots (limit_window)
    bool held = false;                        // hold_receiver() until open_receiver()
    std::optional<JobId> serves;              // as a server: the only job it takes requests of (serve_job)
    // As an aggregator: when the forwards of the aggregates planned here are predicted to be
    // done. They are not on the egress book until granted, but they will use this egress.
    Instant forwards_done{};
    bool aggregates = false;  // seated as an aggregator of some job
  };

  // What the scan needs of every NIC, packed apart from EndpointState (320 bytes) so that a
  // decision over 1,000 candidates touches a few KiB. Mirrors of EndpointState are refreshed
  // by sync_egress() / sync_receiver() after every change of the state they copy.
  struct NicHot {
    Instant egress_tail{};   // egress.tail()
    Instant ingress_tail{};  // ingress.tail()
    Bytes in_flight = 0;     // bytes of its own parts granted and not completed (the credit)
    Version version = 0;     // window.granted(): the version the next grant is applied to
    bool can_grant = true;   // window.can_grant(): within B of the replica
    bool plain_ok = true;    // reservations.allows_other(version): no aggregate needs it
  };

  struct RequestState {
    Request request;
    Index sender = 0;
    Index receiver = 0;
    std::uint32_t parts_open = 0;       // parts without an outcome yet
    std::uint32_t parts_sequenced = 0;  // parts with a sequence number: `own` in staleness.hpp
  };

  struct PendingAggregate {
    Index aggregator = 0;
    Index receiver = 0;
    JobId job{};
    TensorId tensor{};
    Bytes offset = 0;
    Bytes length = 0;
    std::vector<PartRef> members;
    Version base = 0;  // min over members of computed_on + own at grouping
    std::int32_t candidate = kNone;
  };

  struct TransferRecord {
    Index sender = 0;
    Index receiver = 0;
    Bytes bytes = 0;
    Slot slot{};
    bool counts_credit = false;  // the sender's own part (not an aggregate it forwards)
    Seq seq = 0;                 // the sequence it carries at the receiver (0: a Redirect)
    JobId job{};
  };

  struct Pick {
    std::int32_t index = kNone;
    Instant start{};
  };

  // A part whose staleness bound has passed: it and the rest of its request are dropped.
  struct Doomed {
    RequestId request;
    Index sender = 0;
  };

  // The best candidate found so far by a scan, and the earliest start beyond the horizon.
  struct ScanBest {
    Pick pick;
    Instant finish{};
    std::optional<Instant> beyond_horizon;
  };

  Index endpoint(EndpointId id);
  const EndpointState* find(EndpointId id) const;
  Nanos path_time(Index sender, Index receiver, Bytes bytes) const;
  // Copies a writer to `receiver` sends of each update: 2 if it mirrors to the receiver's
  // replica (config writers_mirror), else 1. Writes to an aggregator are not mirrored.
  unsigned sender_copies(Index receiver) const;

  bool packed() const noexcept { return config_.ingress == IngressSharing::packed; }
  // The share of its receiver's line rate candidate c would use (1 unless packed).
  double share(const Candidate& c) const;
  // When c may start at its receiver, given it can start no earlier than `start` otherwise.
  Instant receiver_start(const Candidate& c, Instant start) const;
  // When an endpoint's ingress is wholly free (aggregators book members exclusively).
  static Instant ingress_free(const EndpointState& e) { return std::max(e.ingress.tail(), e.shares.idle_from()); }
  // Books the receiver's side of a grant starting at pick.start (SlotBook or shares).
  Slot book_receiver(Index receiver, const Candidate& c, Instant start, Instant now);

  void sync_egress(Index endpoint) { hot_[endpoint].egress_tail = endpoints_[endpoint].egress.tail(); }
  void sync_receiver(Index endpoint);
  Pick scan(Instant now, std::vector<Doomed>& hopeless);
  // Reads one receiver index in order until nothing further in it can beat `best`.
  void scan_index(const std::map<OrderKey, std::uint32_t>& index, Index receiver, Instant receiver_free,
                  Instant horizon_end, ScanBest& best) const;
  // The earliest any candidate of a rate class (candidate_table.hpp) bound for `receiver` can
  // start there, given none starts before `receiver_free`.
  Instant class_start(Index receiver, int rate_class, Instant receiver_free) const;
  // Whether candidate c may be granted now, apart from time (credit, reservations).
  bool eligible(const Candidate& c) const;
  // The same decision, from every candidate (SchedulerConfig::check_scan).
  Pick scan_all(Instant now, std::vector<Doomed>& hopeless, std::optional<Instant>& wake) const;
  void check_scan(Instant now, const Pick& pick, std::vector<Doomed> hopeless) const;
  bool better(const Candidate& c, Instant finish, const Candidate& best, Instant best_finish) const;
  void drop(std::vector<Doomed> hopeless, std::vector<Outcome>& out);
  void grant_part(const Pick& pick, Instant now, std::vector<Outcome>& out);
  void grant_aggregate(const Pick& pick, Instant now, std::vector<Outcome>& out);
  // Groups the updates that would wait for the server behind `granted` (just granted), or, with
  // pick_joins, `granted` (the pick, not granted yet) with them. True if a group was formed.
  bool try_aggregate(const Candidate& granted, Instant now, std::vector<Outcome>& out, bool pick_joins);

  void refresh_head(Index sender);
  void refresh_durations();
  Candidate part_candidate(Index sender, JobId job, const QueuedPart& part) const;
  std::int32_t add_candidate(const Candidate& c) { return static_cast<std::int32_t>(candidates_.add(c)); }
  // Removes it from the table, and points the owner of the one moved into its place there.
  void remove_candidate(std::int32_t index);
  const Candidate& candidate(std::int32_t index) const { return candidates_[static_cast<std::uint32_t>(index)]; }
  TransferId record_transfer(Index sender, Index receiver, Bytes bytes, Slot slot, bool credit, Seq seq = 0,
                             JobId job = {});
  void finish_request_part(RequestState& request, bool sequenced);

  SchedulerConfig config_;
  Partitioner partitioner_;
  BandwidthEstimator bandwidth_;
  std::uint64_t bandwidth_generation_ = 0;

  std::unordered_map<EndpointId, Index> index_;
  std::vector<EndpointState> endpoints_;
  std::vector<NicHot> hot_;  // parallel to endpoints_
  std::unordered_map<RequestId, RequestState> requests_;
  std::unordered_map<AggregateId, PendingAggregate> aggregates_;
  std::unordered_map<TransferId, TransferRecord> transfers_;
  std::vector<Cancel> cancels_;                      // failed sequenced transfers, emitted by the next schedule()
  std::map<JobId, std::vector<Index>> aggregators_;  // sorted endpoint indices per job
  CandidateTable candidates_;

  std::uint64_t next_transfer_ = 1;
  std::uint64_t next_aggregate_ = 1;
  std::size_t pending_parts_ = 0;
  Instant last_now_{};
  std::optional<Instant> wake_;
  SchedulerStats stats_;
  std::vector<Doomed> scratch_hopeless_;
};

}  // namespace gradlane::sched
