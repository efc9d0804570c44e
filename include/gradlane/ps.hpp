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
// becomes the server at the version it reached: no update it had acknowledged is lost, at most
// `slots` that the server applied are. Workers switch their server to the replica (they are
// already connected to it); a push that was in flight reports lost = true, and pulls go to the
// new server. The promoted server has no replica; bringing a new one up is not supported yet.
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
  std::size_t floats = 0;      // shard size (float32 parameters)
  std::uint32_t slots = 8;     // update slots in the ring: also how far the replica may lag
  float learning_rate = 0.01F;
  float momentum = 0.0F;       // 0: plain SGD
  // A granted sequence whose write has not arrived by then is skipped (server only; in sidecar
  // mode, a head-of-line gap with later updates already here).
  std::chrono::milliseconds hole_timeout{3000};
  // Server in sidecar mode: attach to the host's gradlaned as the server's endpoint (job and
  // endpoint as the workers' requests name them).
  std::optional<sidecar::AttachOptions> sidecar;
  TransportOptions transport{};
};

struct ServerStats {
  std::uint64_t granted = 0;          // sequence numbers handed out (server)
  std::uint64_t applied = 0;          // updates applied to the shard
  std::uint64_t skipped = 0;          // holes skipped in order
  std::uint64_t refused_doorbells = 0;  // doorbells for a sequence not granted to that peer, or done
  std::uint64_t refused_cancels = 0;  // sidecar cancels for a sequence already here or done
  std::uint64_t peers_lost = 0;       // connections that failed with work outstanding, or sent
                                      // a malformed message
  std::uint64_t peers_left = 0;       // workers that disconnected with nothing outstanding
  std::uint64_t replica_acked = 0;    // server: the replica applied every sequence up to this
  std::uint64_t mirrors_fetched = 0;  // replica: updates re-read from the server's slot because
                                      // the worker's mirror write never came
  std::int64_t promoted_at_ns = 0;    // replica: when it became the server (steady clock), or 0
  std::uint64_t lost_in_failover = 0;  // replica: decided updates it could not apply at promotion
};

// What the server decided for one sequence number, in the order it applied them.
struct AppliedUpdate {
  std::uint64_t sequence = 0;
  std::uint32_t worker = 0;   // 0 for a hole
  std::uint64_t tag = 0;      // the worker's tag (e.g. its step)
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
  // Accepts `workers` worker connections (a replica also accepts its primary's), each within
  // `timeout`. Throws Error(timeout) if one does not come.
  void accept_peers(std::size_t workers, Millis timeout);

  // Does what is due, without blocking: answers requests, takes doorbells, applies arrived
  // updates in order, acknowledges, skips holes. Returns how many things it did (0 = idle).
  std::size_t progress();
  // progress() until `applied + skipped` reaches `sequence`, or finished(), or `timeout`
  // passes; false on timeout.
  bool run_until(std::uint64_t sequence, Millis timeout);
  // Nothing more can arrive: a server has no live worker and every granted sequence is
  // decided; a replica has lost its primary and applied every decision it was sent.
  bool finished() const;

  std::uint64_t version() const;                  // updates applied (the shard's model version)
  std::span<const float> model() const;           // the shard (read it only between progress())
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
  std::uint32_t id = 1;                // unique among the shard's workers, > 0
  Endpoint server;
  std::optional<Endpoint> replica;     // where every update is mirrored
  std::size_t floats = 0;              // the shard's size
  Millis timeout{30000};               // bound on each wait (grant, completion, connect)
  // Sidecar mode: ask the host's gradlaned (attached as this worker's NIC endpoint and job)
  // for each push; `server_endpoint` is the server's endpoint id, `tensor` the shard's id.
  std::optional<sidecar::AttachOptions> sidecar;
  std::uint32_t server_endpoint = 0;
  std::uint32_t tensor = 0;
  TransportOptions transport{};
};

struct PushResult {
  bool dropped = false;                    // sidecar mode: too stale, never sent (pull again)
  bool lost = false;                       // the server (or, in sidecar mode, the receiver's
                                           // sidecar, or this host's sidecar restarted) was
                                           // lost mid-push: pull again and go on
  std::uint64_t sequence = 0;              // what the server will apply it as (0 if dropped)
  std::chrono::nanoseconds wire_time{0};   // first post to last completion
};

struct PullResult {
  std::uint64_t version = 0;   // updates applied to the model that was read
  std::uint32_t attempts = 1;  // READ rounds until a consistent snapshot
};

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
  // The server's model version (updates applied), with one small READ of the shard's header
  // and no model transfer: for waiting on a version (a synchronous step's barrier).
  std::uint64_t server_version();
  // Times this worker switched its server to the replica.
  std::uint64_t failovers() const;

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
