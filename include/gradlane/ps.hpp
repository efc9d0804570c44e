// gradlane — the parameter-server data plane: a shard server that applies updates, a replica
// that mirrors it, and the worker's push/pull.
//
// Roles (each a process, or a thread of one):
//   ShardServer(Role::server)   holds a model shard in a registered region and a ring of update
//                               slots; applies updates strictly in sequence order with an SGD
//                               step; owns the shard's sequence in direct mode.
//   ShardServer(Role::replica)  the same regions; applies the same sequence, as the server
//                               decided it, never more than `slots` updates behind.
//   Worker                      computes into its registered gradient buffer, push()es it,
//                               pull()s the model into its registered model buffer.
//
// The push (direct mode, no sidecar; the plain asynchronous parameter server, FIFO):
//   1. worker → server  SEND request {worker, tag, computed_on}
//   2. server → worker  SEND grant {sequence}: the server hands out sequence numbers in request
//                       order, only while slot `sequence % slots` is free at the server and at
//                       the replica (the update that used it was applied and acknowledged).
//   3. worker → replica WRITE gradient into slot, zero-length WRITE_WITH_IMM (imm = low 32
//                       bits of the sequence) — the mirror, from the same registered buffer;
//      worker → server  the same WRITE + doorbell. Two posts, no copy.
//   4. server applies in sequence order (out-of-order arrivals wait in their slots), then
//      tells the replica each sequence's fate: applied, or skipped (a hole: its worker died
//      after the grant, or wrote nothing within hole_timeout). The replica applies exactly
//      what the server applied, in the same order, with the same kernel: bitwise the same
//      model at the same version. The replica acknowledges what it applied; the server never
//      grants a sequence whose slot the replica has not freed.
// Failover (direct mode): when the server dies, the replica sees its connection drop and
// becomes the server at the version it reached: no push a worker saw succeed is lost (the
// replica holds its mirror and applies it, skipping a sequence granted and never written
// before it), at most `slots` that the server applied and whose mirrors never came are.
// Workers switch their server to the replica (they are already connected to it); a push that
// was in flight reports lost = true, and pulls go to the new server. The promoted server
// grants from `slots` past the version it reached, as in sidecar mode below, so a late write
// granted by the dead server is refused. It has no replica until a new one joins it
// (ShardServer::join_server).
// With a sidecar (sidecar mode; the server and each worker attach to their host's gradlaned):
// the receiver's sidecar owns the sequence instead. A worker asks its sidecar (Client::request),
// and the go grant carries the sequence and the slot time; the worker writes as above and
// completes the grant with the measured wire time. The sidecar may drop an update that would
// break the staleness bound (push() says so: it never crossed the network). The server
// applies in sequence order as before, skips a sequence its sidecar cancels (the sender failed
// after its grant), and reports what server and replica have both applied (Client::applied),
// which is what lets the sidecar grant the slot again: gradlaned's --replica-bound must not
// exceed the shard's slots. Each update must be one part: the shard at most the sidecar's
// partition size (4 MiB).
// Failover (sidecar mode): the promoted replica attaches to its own host's gradlaned with
// AttachOptions::take_over_at, and that sidecar owns the server's sequence from then on (its
// peers forward the workers' requests there; the old owner drops what waited for the dead
// server, Reason::receiver_moved, which a worker reports as a lost push). The sequence goes
// on `slots` past the version the replica reached: every sequence the old owner may have
// granted (at most B ahead of the replica's ack, B = gradlaned's --replica-bound, which must
// not exceed the shard's slots) is skipped, so a late write granted
// by the old owner rings for a sequence already skipped and is refused, never applied as
// another worker's update; the promoted server publishes where it starts (its shard header's
// refuse_below) and a worker that failed over reads it after each write, so such a push
// reports lost = true instead of success.
// Aggregation (direct mode): workers told to push to an Aggregator (WorkerOptions::aggregator)
// ask it for a member slot instead of the server — the same request / grant / WRITE +
// doorbell, into the aggregator's ring, and nothing to the replica. The aggregator takes
// members in its own sequence order, and once `group` of them are here it sums them with the
// Eigen kernel in a fixed order (by worker id, then tag) straight into the registered buffer
// of its own ps::Worker, which pushes that one update to the server and the replica like any
// worker (its id at the server is AggregatorOptions::id; its tag, the group's number). So the
// server and the replica spend one slot, one version and one update's bytes per group. The
// aggregate's computed_on is its OLDEST member's: its staleness is never understated. Members
// that were granted and never written (dead worker, hole_timeout) are left out; a group
// forwards short when no member is coming (workers gone, or `linger` without one). Pulls still
// go to the server. A worker whose aggregator dies reports the push lost and pushes to the
// server directly from then on.
// A member's acknowledgment (both modes): push() returns once the member is in the
// aggregator's slot (PushResult::pending) — the gradient buffer is free again, but the update
// has not reached the server. The aggregator tells each member's worker, after its forward
// completed, that the member was delivered (the server's sequence for the sum) or not
// (Forwarded message); Worker::take_member_outcomes() reports it. A member whose aggregator
// dies before that is reported not delivered: it may have been summed into a forward that
// reached the server, but nothing acknowledged is ever missing there; so is one written after
// its grant was written off (direct mode). In sidecar mode a member the aggregator gives up on
// (overwritten in its slot, or its aggregate never granted) gets no outcome: it stays pending
// and settle() returns false. Worker::settle() says
// the worker pushes no more (the aggregator forwards what it holds at once) and waits for the
// outcomes.
// Aggregation (sidecar mode): gradlaned decides it (gradlaned --aggregator JOB:ENDPOINT names
// the endpoint whose Aggregator, attached in sidecar mode, may sum a job's updates). When
// updates would queue for the server's ingress, its scheduler redirects a group of them: each
// member's worker gets a redirect grant (sequence = the aggregate id, a slot at the aggregator)
// and writes its gradient into its own member slot there (aggregate id % slots), doorbell = the
// id's low 32 bits; the aggregator gets one aggregate grant (the server's sequence, the member
// count, a slot), sums the members that came in a fixed order (worker id) and writes the sum
// as that sequence to the server and the replica, like any granted update. The scheduler
// gives the group the staleness of its stalest member, so tau holds for the sum.
// The pull: three chained RDMA READs of the server's model region (header, floats, header);
// the copy is accepted only if both headers show the same even version (a seqlock: the server
// marks the header odd while it applies), else it is read again. No server CPU on the path.
//
// Errors: a peer that dies is dropped (its granted sequences become holes, skipped in order);
// a malformed control message costs the peer that sent it its connection, never the server.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradlane/connection.hpp"
#include "gradlane/device.hpp"
#include "gradlane/options.hpp"
#include "gradlane/sidecar.hpp"

namespace gradlane::ps {

enum class Role : std::uint8_t { server = 1, replica = 2 };

struct ShardOptions {
  std::size_t floats = 0;   // shard size (float32 parameters)
  std::uint32_t slots = 8;  // update slots in the ring: also how far the replica may lag
  float learning_rate = 0.01F;
  float momentum = 0.0F;  // 0: plain SGD
  // A granted sequence whose write has not arrived by then is skipped (server only; in sidecar
  // mode, a head-of-line gap with later updates already here).
  std::chrono::milliseconds hole_timeout{3000};
  // Server (and a replica, once promoted): after a worker was lost — gone without saying it
  // finished — the server is not finished() until it came back or this long after that loss,
  // even with no worker left: one cut off by a link that came back rejoins (Worker's
  // constructor under its id; gradlane_train worker --rejoin-within). 0: finished as soon as no
  // worker is left.
  std::chrono::milliseconds rejoin_grace{0};
  // Server in sidecar mode: attach to the host's gradlaned as the server's endpoint (job and
  // endpoint as the workers' requests name them). Replica in sidecar mode: the same job and
  // the server's endpoint, for its own host's gradlaned (started with --standby ENDPOINT:JOB); it
  // attaches only when promoted, taking the server's sequence over there (failover below).
  std::optional<sidecar::AttachOptions> sidecar;
  TransportOptions transport{};
  // Replica: read each update the server applied from the server's slot (one RDMA READ, no
  // server CPU: the server keeps a slot until the replica acknowledged it) as soon as the
  // server's decision for it arrives, instead of waiting for the worker's mirror. With workers
  // that do not mirror (WorkerOptions::mirror = false) every update leaves the worker once, and
  // the replica's copy crosses the server's egress, not the worker's link again.
  bool read_updates_from_server = false;
  // Server: a worker may write only the slot it was granted, and only until its doorbell
  // comes or the grant is skipped. Each slot is a region of its own that no key opens; the
  // granted worker gets the key of a type-2 memory window bound on its connection over that
  // slot, invalidated once the doorbell arrives or the hole is skipped. The NIC refuses a
  // write with the ring's key, to another slot, from another connection, or late — and the
  // writer's connection fails (IBV_WC_REM_ACCESS_ERR); the server goes on without it. Costs two
  // work requests per update on the server's send queue. Needs a device with type-2 windows
  // (Error(unsupported) otherwise).
  // Direct mode: the key comes in the grant. Sidecar mode: the server gives its gradlaned a
  // random grant key (sidecar::AttachOptions::grant_key); every grant of its sequence carries
  // that key's token (sidecar::Grant::token), which the worker (or an aggregator's forward)
  // shows the server in a Claim before writing — one more round trip per push — and only a
  // claim with the right token opens the slot, once, and only a doorbell from the claiming
  // connection counts. A wrong token costs the claimant its connection.
  // Replica (set it on both): its ring is opened by no key either. The server tells it its key
  // on connect; a worker claims its mirror's slot with its grant's token (in direct mode the
  // grant carries one) — one more round trip per mirrored push — and only that worker's mirror
  // and doorbell count there. Promoted, the replica grants with windows too. A replica with
  // windows whose server has none cannot be mirrored to (it says so on its stderr).
  bool grant_windows = false;
  // run_until() sleeps on the shared completion queue while nothing arrives (20 ms at a time,
  // so the timers above still run) instead of spinning a core. Costs a wake-up (an interrupt
  // and a thread switch) on the first arrival after a quiet spell: perf/results/ps-doorbells.md.
  bool block_when_idle = false;
  // Receive buffers shared by every connection (an SRQ on the shared completion queue, see
  // completion_queue.hpp) instead of recv_queue_depth each: 0 keeps them per connection.
  // Measured (perf/results/ps-doorbells.md): 32 connections on 512 shared buffers keep 2 MiB
  // of receive buffers instead of 16 MiB at the same doorbell rate; 1,000 workers would need
  // 512 MiB per connection-owned rings. Size it to the doorbells and control messages that may
  // wait at once (e.g. 2 × workers): a dry queue makes senders retry ("receiver not ready").
  std::uint32_t shared_receives = 0;
};

struct ServerStats {
  std::uint64_t granted = 0;            // sequence numbers handed out (server)
  std::uint64_t applied = 0;            // updates applied to the shard
  std::uint64_t skipped = 0;            // holes skipped in order
  std::uint64_t refused_doorbells = 0;  // doorbells for a sequence not granted to that peer, or done
  std::uint64_t refused_cancels = 0;    // sidecar cancels for a sequence already here or done
  std::uint64_t claimed = 0;            // sidecar mode, grant windows: slots opened to the worker
                                        // that showed its grant's token
  std::uint64_t refused_claims = 0;     // sidecar mode, grant windows: claims with a token that is
                                        // not the grant's, or of a sequence not open to writing
  std::uint64_t peers_lost = 0;         // connections that failed with work outstanding, or sent
                                        // a malformed message
  std::uint64_t peers_left = 0;         // workers that disconnected with nothing outstanding
  std::uint64_t peers_joined = 0;       // workers admitted after accept_peers (a restarted
                                        // worker rejoining, or a new one)
  std::uint64_t joins_refused = 0;      // connections refused after accept_peers (no hello in
                                        // time, or not a worker's)
  std::uint64_t replica_acked = 0;      // server: the replica applied every sequence up to this
  std::uint64_t mirrors_fetched = 0;    // replica: updates re-read from the server's slot because
                                        // the worker's mirror write never came
  std::int64_t promoted_at_ns = 0;      // replica: when it became the server (steady clock), or 0
  std::uint64_t lost_in_failover = 0;   // replica: decided updates it could not apply at promotion
  std::uint64_t replicas_joined = 0;    // server: replicas that joined it running (join_server)
  std::uint64_t joined_at = 0;          // replica that joined a running server: the version of the
                                        // snapshot it started from
  std::uint64_t sidecars_resumed = 0;   // sidecar mode: times our gradlaned died and we took our
                                        // sequence over at the one restarted on this host
  // Server: a worker reached the replica for a slot while this server lived (its link to us
  // failed), so this server stopped granting, finished what it had granted and handed the job
  // to the replica (promoted when we go): its model is not the job's final one.
  bool stepped_down = false;
};

// What the server decided for one sequence number, in the order it applied them.
struct AppliedUpdate {
  std::uint64_t sequence = 0;
  std::uint32_t worker = 0;  // 0 for a hole
  // Direct mode: the worker's tag (e.g. its step). Sidecar mode: how many of that worker's
  // updates arrived before this one (a doorbell carries no tag; a lost push does not count).
  std::uint64_t tag = 0;
  std::uint64_t computed_on = 0;  // model version the gradient was computed on
  bool skipped = false;
};

class ShardServer {
 public:
  // Registers the shard (initialised from `initial`, which must hold options.floats values)
  // and the slot ring on `device`, and listens on `port` (0 = any free port; see port()).
  ShardServer(const Device& device, Role role, std::uint16_t port, const ShardOptions& options,
              std::span<const float> initial);
  ShardServer(ShardServer&&) noexcept;
  ShardServer& operator=(ShardServer&&) noexcept;
  ~ShardServer();

  std::uint16_t port() const;
  // Server only: connects to the replica's ShardServer (which must be listening) and becomes
  // its primary. Call before accept_workers().
  void connect_replica(const std::string& address, std::uint16_t port, Millis timeout);
  // Replica only, instead of accept_peers(): joins a server that is already running (one whose
  // replica was lost, or a promoted replica — a new replica brought up from it). Connects to
  // the server's port, as a worker would; the server adopts it as its replica, hands it a
  // snapshot of its model at the version v it reached (a copy it makes once, read here by
  // RDMA READ) and from then on tells it every decision after v. It says where it listens; the
  // server tells its workers, which connect, mirror here from a sequence they announce, and
  // fail over here. Until then this replica reads each of a worker's updates from the server's
  // slot. A worker still connected to another replica (dead, its failure not seen yet) drops it
  // for this one. Either mode; with momentum the server's velocity comes with the model. Throws
  // Error(protocol) when the server refuses (it has a replica, it is a replica).
  void join_server(const std::string& address, std::uint16_t port, Millis timeout);
  // Accepts `workers` worker connections (a replica also accepts its primary's), each within
  // `timeout`. Throws Error(timeout) if one does not come.
  //
  // Membership: from then on progress() keeps admitting workers — a worker whose process was
  // restarted connects again under its id (after the server wrote off its old connection) and
  // is served like the others, counted in ServerStats::peers_joined. If the old connection of
  // that id still looks alive (the restart was quicker than its failure), the new one
  // supersedes it: the old is lost, its granted sequences skipped. A connection whose first
  // message is not a worker's hello within the transport's connect_timeout is refused
  // (joins_refused). A worker that comes after finished() turned true finds nobody: the job
  // ended when its last worker left.
  void accept_peers(std::size_t workers, Millis timeout);

  // Does what is due, without blocking: answers requests, takes doorbells, applies arrived
  // updates in order, acknowledges, skips holes. Returns how many things it did (0 = idle).
  std::size_t progress();
  // progress() until `applied + skipped` reaches `sequence`, or finished(), or `timeout`
  // passes; false on timeout. Idle, it spins, or sleeps when options.block_when_idle is set.
  bool run_until(std::uint64_t sequence, Millis timeout);
  // Sleeps (no spinning) until a message, doorbell or connection event arrives on any of the
  // server's connections, or `timeout` passes; false on timeout. Every connection of a
  // ShardServer — workers, primary, replica — shares one completion queue, which a
  // progress() polls once per round and this call blocks on. For embedders with their own
  // loop: progress() while it does work, wait_for_input() when it returns 0.
  bool wait_for_input(Millis timeout);
  // Server: progress() until the replica acknowledged every decision made so far (applied or
  // skipped), or `timeout` passes; false on timeout. Call it before stopping, so the replica
  // is not left waiting for a decision the server never sent (the destructor does it too,
  // bounded by 5 s). True at once for a replica or a server without one.
  bool drain_replica(Millis timeout);
  // Nothing more can arrive: a server has no live worker and every granted sequence is
  // decided; a replica has lost its primary and applied every decision it was sent.
  bool finished() const;
  // Server with a replica: it lost every worker, none of which said it finished — what a
  // partition around this server's host looks like from inside, whether or not it has noticed
  // the replica's link go too (an idle replica connection fails only when next used). The
  // workers may carry the job on at the promoted replica: this model's versions past
  // stats().replica_acked were never confirmed there, and are not the job's.
  bool cut_off() const;

  std::uint64_t version() const;  // the shard's model version: sequences decided (applied or skipped)
  // Sequences that arrived (or were cancelled) and wait behind the next one, which has not:
  // head-of-line blocking, as when a worker holds its grant. 0 when the next one is here.
  std::size_t waiting_behind_hole() const;
  std::span<const float> model() const;  // the shard (read it only between progress())
  const ServerStats& stats() const;
  const std::vector<AppliedUpdate>& history() const;  // what was applied or skipped, in order
  std::size_t live_workers() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

struct Endpoint {
  std::string address;
  std::uint16_t port = 0;
};

struct WorkerOptions {
  std::uint32_t id = 1;  // unique among the shard's workers, > 0
  Endpoint server;
  std::optional<Endpoint> replica;  // where every update is mirrored; where pulls and pushes
                                    // go if the server fails
  // Write every update to the replica's slot too (R3: the server's NIC does not forward it). Off:
  // the worker only stays connected to the replica for failover, and the replica reads each
  // update from the server's slot (ShardOptions::read_updates_from_server must be on there, or
  // it waits hole_timeout per update before reading).
  bool mirror = true;
  std::size_t floats = 0;  // the shard's size
  Millis timeout{30000};   // bound on each wait (grant, completion, connect)
  // How long the constructor tries to reach each peer while nothing listens there or it does
  // not answer (0: `timeout`). A worker rejoining after a link failure bounds it by what is
  // left of its own deadline.
  Millis connect_within{0};
  // A grant taken up later than this after it arrived (direct mode: after the worker last saw
  // its receive queue empty — a grant that waited at a slow server is fresh, one that sat here
  // while the worker was stopped, or while the app ran between start_push() and wait_push(),
  // is not) or after its slot start (sidecar mode) is not written: the server may already have skipped its sequence (it
  // waits ShardOptions::hole_timeout, 3 s by default, for a granted write), and a write into a skipped sequence would
  // be acknowledged here and never applied. The worker asks for a new grant instead (at most 3 times, then the push
  // reports lost). Keep it well below the server's hole_timeout: the margin covers the write itself and the grant's
  // trip.
  Millis grant_lifetime{1500};
  // Sidecar mode: ask the host's gradlaned (attached as this worker's NIC endpoint and job)
  // for each push; `server_endpoint` is the server's endpoint id, `tensor` the shard's id.
  std::optional<sidecar::AttachOptions> sidecar;
  // Sidecar mode: how long pushes refused because no reachable sidecar owns the server's
  // sequence (receiver_unreachable, unknown_receiver: a failover under way) are reported lost
  // before wait_push() throws that error; and how long after this worker failed over a push
  // refused as version_from_future (its sidecar has not heard of the takeover yet) is too.
  Millis failover_patience{5000};
  std::uint32_t server_endpoint = 0;
  std::uint32_t tensor = 0;
  // Direct mode: push to this Aggregator instead of the server (pulls still go to the server;
  // the replica gets the aggregate from the aggregator).
  // Sidecar mode: the Aggregator (in sidecar mode) at endpoint `aggregator_endpoint`; the worker
  // writes there only the updates its sidecar redirects to that endpoint. A redirect to an
  // aggregator the worker is not connected to is completed as failed and reported lost.
  std::optional<Endpoint> aggregator;
  std::uint32_t aggregator_endpoint = 0;
  TransportOptions transport{};
};

struct PushResult {
  bool dropped = false;                   // sidecar mode: too stale, never sent (pull again)
  bool lost = false;                      // the server (or, in sidecar mode, the receiver's
                                          // sidecar, or this host's sidecar restarted) was
                                          // lost mid-push: pull again and go on. It may or
                                          // may not be applied (a promoted replica applies a
                                          // mirror it holds); never resent
  std::uint64_t sequence = 0;             // what the server will apply it as (0 if dropped or
                                          // redirected; direct mode with an aggregator: its
                                          // member sequence there)
  std::uint64_t aggregate = 0;            // sidecar mode: redirected to the aggregator as a
                                          // member of this aggregate (it reaches the server
                                          // summed; AggregatedUpdate::tag names it)
  std::chrono::nanoseconds wire_time{0};  // first post to last completion
  std::uint32_t expired_grants = 0;       // grants taken up too late to write (the worker
                                          // stalled past WorkerOptions::grant_lifetime):
                                          // not written, asked for again
  bool pending = false;                   // in an aggregator's slot, not yet forwarded: not
                                          // acknowledged until take_member_outcomes() says
                                          // it was delivered
};

// What became of a push an aggregator took (PushResult::pending).
struct MemberOutcome {
  std::uint64_t tag = 0;       // the push's tag
  std::uint64_t member = 0;    // its PushResult::sequence (direct mode) or ::aggregate (sidecar)
  std::uint64_t sequence = 0;  // delivered: the server's sequence for the sum it is part of
  bool delivered = false;      // false: its forward was lost, or the aggregator died first
};

// The last push of a worker id that its server took (its doorbell accepted: applied, or to be):
// what a restarted worker resumes after (Worker::last_landed).
struct LandedPush {
  std::uint64_t tag = 0;          // the push's tag (its step)
  std::uint64_t sequence = 0;     // the server's sequence for it
  std::uint64_t computed_on = 0;  // the version it was computed on; 0 if the answer came from a
                                  // promoted replica (the server's decisions do not carry it)
};

struct PullResult {
  std::uint64_t version = 0;   // sequences decided (applied or skipped) in the model that was read
  std::uint32_t attempts = 1;  // READ rounds until a consistent snapshot
};

// Whether an error from a Worker or an Aggregator says its server and replica are out of reach
// (a link down, a host gone, a port closed) rather than a mistake of its own or a peer's: the
// case in which a new connection to the running job (rejoining it) can help.
bool out_of_reach(const Error& e);

class Worker {
 public:
  // Connects to the server (and the replica) and learns their regions.
  Worker(const Device& device, const WorkerOptions& options);
  Worker(Worker&&) noexcept;
  Worker& operator=(Worker&&) noexcept;
  ~Worker();

  // Registered buffers, allocated by the worker: compute the gradient in place, read the
  // model that pull() brought. Nothing is copied between them and the wire.
  std::span<float> gradient();
  std::span<const float> model() const;

  // Non-blocking push: sends the request; the gradient buffer must stay untouched until
  // wait_push() returns. One push in flight per worker.
  void start_push(std::uint64_t computed_on, std::uint64_t tag = 0);
  // Waits for the grant, writes (replica first, then server), waits for both completions.
  PushResult wait_push();
  PushResult push(std::uint64_t computed_on, std::uint64_t tag = 0) {
    start_push(computed_on, tag);
    return wait_push();
  }
  // Reads a consistent snapshot of the server's shard into model().
  PullResult pull();
  // The server's model version (sequences decided), with one small READ of the shard's header
  // and no model transfer: for waiting on a version (a synchronous step's barrier).
  std::uint64_t server_version();
  // Times this worker switched its server to the replica.
  std::uint64_t failovers() const;
  // A restarted worker, before it resumes (ps-lite's recovery): the last push of this worker id
  // the server took — its doorbell accepted, so it is or will be applied — or nullopt if none.
  // The previous life may have died between its write and hearing that it landed; pushing that
  // step again would apply it twice. Ask before the first push: a push of this life counts too.
  // Direct mode, pushing to the server; a promoted replica answers as its server would have.
  // Sidecar mode and pushes through an aggregator: invalid_argument (the server does not learn
  // the tag of a push there).
  std::optional<LandedPush> last_landed();
  // Outcomes of pending pushes (PushResult::pending) learned since the last call, in the order
  // they came; looks at the aggregator's connection without waiting.
  std::vector<MemberOutcome> take_member_outcomes();
  // Pending pushes with no outcome yet.
  std::size_t members_pending() const;
  // This worker pushes no more: tells its aggregator so (it forwards what it holds without
  // waiting for a full group) and waits up to `timeout` for every pending push's outcome
  // (take_member_outcomes()). Returns true when none is left pending.
  bool settle(Millis timeout);
  // Sidecar mode: the bytes this worker's job still has to push, declared with every request
  // from the next push on (sidecar::Update::job_remaining: gradlaned serves the job with the
  // least work left first where jobs share a NIC). 0 (the default): not declared.
  void set_job_remaining(std::uint64_t bytes);
  // Bytes of gradient or model the CPU copied on this worker's data path. Pushes and pulls move
  // by RDMA between registered buffers; the one copy is a payload of at most
  // TransportOptions::max_inline bytes (64), which is posted inline: the provider copies it into
  // the work request. So 0 for any shard above 16 floats.
  std::uint64_t bytes_copied() const;

  struct State;

 private:
  friend class Aggregator;
  // The aggregator's forward in sidecar mode: the gradient written as sequence `sequence` (its
  // sidecar's grant), mirrored to the replica; a server failure fails over (lost = true). Not
  // written (lost = true) if the server has decided that sequence already: it skipped it, its
  // hole_timeout having passed while the aggregator waited for members or was stalled.
  // `token`: the aggregate grant's (sidecar::Grant::token), claimed at a server with grant
  // windows before the write; 0: none.
  PushResult write_as(std::uint64_t sequence, std::uint64_t token = 0);
  // The aggregator's forward in direct mode: tells the server where the aggregator listens, so
  // workers that lost it (it was restarted) come back to it.
  void announce_aggregator(const std::string& address, std::uint16_t port);
  std::unique_ptr<State> state_;
};

// ---- aggregation: sum k workers' updates off the server ----

struct AggregatorOptions {
  std::uint32_t id = 0;  // its worker id at the server: unique among the shard's workers, > 0
  Endpoint server;
  std::optional<Endpoint> replica;  // the aggregate is mirrored there, as any worker's update
  std::size_t floats = 0;           // the shard's size
  std::uint32_t group = 4;          // k: member updates summed into one forwarded update
  std::uint32_t slots = 0;          // member slots in the ring, >= group (0: 2 × group, so the next
                                    // group is written while one is summed and forwarded)
  // A granted member whose write has not arrived by then is left out of its group.
  std::chrono::milliseconds hole_timeout{3000};
  // A short group is forwarded when no member is granted or waiting and none has arrived for
  // this long (or at once when every worker has left), so no gradient waits without bound.
  std::chrono::milliseconds linger{500};
  Millis timeout{30000};  // bound on each wait (connect, the forward's grant and write)
  TransportOptions transport{};
  // Sidecar mode: attach to the host's gradlaned as this job and endpoint (gradlaned started
  // with --aggregator JOB:ENDPOINT). Its scheduler forms the groups: it redirects members here
  // when the server is busy and grants each aggregate a server sequence and slot; `group` and
  // `linger` are unused, `slots` counts member slots per worker (0: 16) — aggregate id % slots
  // is a worker's slot for that aggregate, so a worker may have that many aggregates in flight
  // here. A member that has not come by hole_timeout after its aggregate's slot is left out;
  // an aggregate none of whose members came is completed as failed (the server skips it).
  std::optional<sidecar::AttachOptions> sidecar;
  // Sidecar mode: the workers that may push through it at once (0: as many as accept_workers()
  // takes). Each connection gets its own partition of the ring, 4 more are spare; a worker's
  // partition comes back once it is gone and the members it wrote were forwarded, so workers
  // may come back any number of times. A restarted aggregator (accept_workers(0)) needs it to
  // have room for its workers coming back.
  std::uint32_t workers = 0;
  // Sidecar mode: each worker may write only its own partition. Every partition is a region of
  // its own that no key opens; a worker is given, when it connects, the key of a type-2 memory
  // window bound on its connection over its partition alone. The NIC refuses a write to another
  // worker's member slots (or from another connection), and the writer's connection fails. No
  // cost per push: the window is bound once per connection. Needs type-2 windows
  // (Error(unsupported)); not in direct mode, where members share the ring's slots by sequence
  // (Error(invalid_argument)).
  bool grant_windows = false;
  // Direct mode: when the forward has lost both the server and the replica (out_of_reach: a
  // link down), it connects to the running job again for up to this long (0: never) instead of
  // failing progress(); the group it was forwarding is reported lost to its members.
  Millis rejoin_within{0};
};

struct AggregateMember {
  std::uint32_t worker = 0;
  std::uint64_t tag = 0;
  std::uint64_t computed_on = 0;
};

// One forwarded update: what the aggregator summed and what the server will apply it as.
// Sidecar mode: tag is the sidecar's aggregate id (PushResult::aggregate at the members'
// workers); a member's tag and computed_on are 0 (the aggregator only sees its write).
struct AggregatedUpdate {
  std::uint64_t tag = 0;                 // the group's number (1, 2, …): the tag the server records
  std::uint64_t sequence = 0;            // the server's sequence for it (0 if the push was lost)
  std::uint64_t computed_on = 0;         // the oldest member's
  std::vector<AggregateMember> members;  // in the order they were summed (worker id, then tag)
  bool lost = false;                     // the server failed mid-push (the replica took over)
};

struct AggregatorStats {
  std::uint64_t granted = 0;            // member slots handed out (sidecar mode: aggregate grants)
  std::uint64_t summed = 0;             // member updates summed into forwarded updates
  std::uint64_t skipped = 0;            // granted members that never came (left out of their group)
  std::uint64_t forwarded = 0;          // updates pushed to the server
  std::uint64_t short_groups = 0;       // of them, with fewer than `group` members
  std::uint64_t lost = 0;               // forwards lost to a server failure
  std::uint64_t refused_doorbells = 0;  // for a member sequence not granted to that worker, or done
  std::uint64_t peers_lost = 0;         // workers that failed with work outstanding or misbehaved
  std::uint64_t peers_left = 0;         // workers that disconnected with nothing outstanding
  std::uint64_t peers_joined = 0;       // direct mode: workers admitted after accept_workers (they
                                        // come back to a restarted aggregator)
  std::uint64_t cancelled = 0;          // sidecar mode: aggregates none of whose members came
  std::uint64_t displaced = 0;          // sidecar mode: members overwritten in their slot before their
                                        // aggregate was due (a worker had more than `slots` in flight)
  std::uint64_t rejoins = 0;            // the forward connected to the job again (rejoin_within)
  // Bytes the CPU copied: a group of one member (its "sum" is a copy of the member's slot)
  // and the forward's inline payloads (Worker::bytes_copied). 0 with full groups of > 16 floats.
  std::uint64_t bytes_copied = 0;
};

class Aggregator {
 public:
  // Registers the member ring on `device`, listens on `port` (0 = any; see port()), and
  // connects to the server (and replica) as worker options.id: the server must be accepting.
  Aggregator(const Device& device, std::uint16_t port, const AggregatorOptions& options);
  Aggregator(Aggregator&&) noexcept;
  Aggregator& operator=(Aggregator&&) noexcept;
  ~Aggregator();

  std::uint16_t port() const;
  // Accepts `workers` worker connections, each within `timeout` (Error(timeout) otherwise).
  // From then on progress() keeps admitting workers, and at its start the aggregator told the
  // server where it listens — the server passes that to its workers, so a restarted aggregator
  // (accept_workers(0); in sidecar mode with AggregatorOptions::workers) is found again by the
  // workers that lost it.
  void accept_workers(std::size_t workers, Millis timeout);
  // Does what is due without waiting, except that a group ready to forward is summed and
  // pushed before it returns (at most one per call; the push waits for the server's grant).
  // Returns how many things it did (0 = idle). Throws only when the server and its replica
  // are both unreachable.
  std::size_t progress();
  // progress() until finished(), or `timeout` passes; false on timeout.
  bool run(Millis timeout);
  // Some worker came, none is left, and every member that came was forwarded.
  bool finished() const;

  const AggregatorStats& stats() const;
  const std::vector<AggregatedUpdate>& history() const;  // forwarded updates, in order
  // The registered buffer the last group was summed into and written from (valid until the
  // next progress()).
  std::span<const float> last_sum() const;
  std::size_t live_workers() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// ---- sharding: a model's tensors over S servers ----

// Where a tensor lives: on shard server `server`, floats [offset, offset + floats) of its shard.
struct TensorPlacement {
  std::uint32_t server = 0;
  std::size_t offset = 0;
  std::size_t floats = 0;
};

// BytePS-style placement by size: tensors, largest first, each onto the server with the fewest
// floats so far (ties: the lowest index); within a shard, tensors keep the model's order.
// Deterministic, so servers and workers compute the same placement independently.
std::vector<TensorPlacement> place_tensors(std::span<const std::size_t> tensor_floats, std::uint32_t servers);
// Each server's shard size under `placement`.
std::vector<std::size_t> shard_floats(std::span<const TensorPlacement> placement, std::uint32_t servers);

// A worker of a sharded model: one Worker per shard server (each with its own sequence and
// replica), and each tensor a view into its shard's registered buffers. push() overlaps the
// shards: every request goes out first, then each shard's write as its grant comes.
class ShardedWorker {
 public:
  // shards[s] are the options for server s (its address, replica, sidecar); their `floats` are
  // set here from the placement. Throws Error(invalid_argument) if shards.size() != servers.
  ShardedWorker(const Device& device, std::span<const std::size_t> tensor_floats, std::vector<WorkerOptions> shards);

  std::size_t tensors() const { return placement_.size(); }
  // Throw Error(invalid_argument) for a tensor that does not exist.
  std::span<float> gradient(std::size_t tensor);
  std::span<const float> model(std::size_t tensor) const;
  const std::vector<TensorPlacement>& placement() const { return placement_; }
  Worker& shard(std::uint32_t server) { return workers_.at(server); }

  // Pushes every shard's gradient; computed_on[s] is the version of shard s it was computed on.
  std::vector<PushResult> push(std::span<const std::uint64_t> computed_on, std::uint64_t tag = 0);
  // Pulls every shard; result[s] is shard s's version.
  std::vector<PullResult> pull();

 private:
  const TensorPlacement& at(std::size_t tensor) const;
  std::vector<TensorPlacement> placement_;
  std::vector<Worker> workers_;
};

}  // namespace gradlane::ps
