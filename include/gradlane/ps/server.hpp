// gradlane — the parameter server's shard server and its replica (ps::ShardServer): the
// shard in a registered region, a ring of update slots, updates applied in sequence order.
// The protocol: gradlane/ps.hpp and docs/parameter-server.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradlane/connection.hpp"  // Millis
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
  // Direct mode: synchronous SGD with backup workers (Chen et al., "Revisiting distributed
  // synchronous SGD"). Sequences are taken in rounds of `round` updates (versions r·round up to
  // (r+1)·round − 1 are round r's), and an update is granted only a sequence of the round of
  // the version it was computed on: the first `round` requests of a round are taken, a later
  // one is refused before it is written (Worker::push says dropped; pull the next round's
  // model). Workers that start a round only once the previous one is complete (the server's
  // version reaches r·round) and a learning rate divided by `round` make each round one step
  // of the mean of its first `round` gradients, however many workers compute it. 0: no rounds.
  // Sidecar mode refuses it: there the staleness bound is the sidecar's τ.
  std::uint64_t round = 0;
  // Stale-synchronous parallel (Ho et al.): the number N of workers whose clocks the shard keeps.
  // A worker's clock is the tag of its latest applied update + 1 (its steps done, when it tags
  // each push with its step); the slowest of workers 1..N is published in the shard's header
  // for Worker::slowest_clock(), and a worker under bound s starts step k only once
  // k <= slowest + s. Updates of other ids count for nothing. The replica keeps them too (the
  // server tells it each update's worker and tag); one that joined a running server, or a
  // restarted server, knows a worker's clock again from its next applied update. 0: no clocks.
  std::uint32_t clock_workers = 0;
  // The tensor this shard holds (a model's tensors over several shards: ps/sharded.hpp), in the
  // shard's header: a Worker whose WorkerOptions::tensor differs is refused when it connects
  // (Error(invalid_argument)), as is an Aggregator's forward, before anything is written.
  std::uint32_t tensor = 0;
};

struct ServerStats {
  std::uint64_t granted = 0;            // sequence numbers handed out (server)
  std::uint64_t applied = 0;            // updates applied to the shard
  std::uint64_t skipped = 0;            // holes skipped in order
  std::uint64_t refused_doorbells = 0;  // doorbells for a sequence not granted to that peer, or done
  std::uint64_t refused_cancels = 0;    // sidecar cancels for a sequence already here or done
  std::uint64_t held_cancels = 0;       // sidecar cancels of a claimed sequence whose claimant's
                                        // sidecar was lost (no grant windows): held for the claimant
  std::uint64_t refused_rounds = 0;     // direct mode, ShardOptions::round: requests whose round
                                        // was full (the worker's push is dropped)
  std::uint64_t refused_requests = 0;   // direct mode: requests computed on a version ahead of
                                        // every sequence granted here, or, at a replica whose
                                        // primary lives, from a worker that addressed it as its
                                        // server (the worker's push fails)
  std::uint64_t claimed = 0;            // sidecar mode: sequences claimed before their write (with
                                        // grant windows, opened to the worker that showed its
                                        // grant's token; without, held for the claimant)
  std::uint64_t refused_claims = 0;     // sidecar mode: claims with a token that is not the
                                        // grant's, or of a sequence not open to writing
  std::uint64_t peers_lost = 0;         // connections that failed with work outstanding, or sent
                                        // a malformed message
  std::uint64_t peers_left = 0;         // workers that disconnected with nothing outstanding
  std::uint64_t peers_joined = 0;       // workers admitted after accept_peers (a restarted
                                        // worker rejoining, or a new one)
  std::uint64_t joins_refused = 0;      // connections refused after accept_peers (no hello in
                                        // time, or not a worker's)
  std::uint64_t replica_acked = 0;      // server: the replica applied every sequence up to this
  bool has_replica = false;             // server: a replica is connected now
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
  // The worker's tag (e.g. its step); in sidecar mode the one the worker sent ahead of its
  // write. An aggregator's forward in sidecar mode, which sends none: how many of its updates
  // arrived before this one.
  std::uint64_t tag = 0;
  std::uint64_t computed_on = 0;  // model version the gradient was computed on
  bool skipped = false;
  // When (steady_clock, i.e. CLOCK_MONOTONIC, ns: gradlaned's schedule log's clock) the server
  // took the update's doorbell, and began and ended its apply (a skip: ended is when it was
  // skipped); 0 where not known here (a skip has no doorbell or apply, a replica's mirror no
  // doorbell of its own).
  std::int64_t doorbell_ns = 0;
  std::int64_t apply_start_ns = 0;
  std::int64_t apply_end_ns = 0;
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

}  // namespace gradlane::ps
