// gradlane — a parameter-server worker (ps::Worker): computes into its registered gradient
// buffer, pushes it to its server (or aggregator), pulls the model. The protocol:
// gradlane/ps.hpp and docs/parameter-server.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradlane/connection.hpp"
#include "gradlane/device.hpp"
#include "gradlane/error.hpp"
#include "gradlane/options.hpp"
#include "gradlane/sidecar.hpp"

namespace gradlane::ps {

class Aggregator;

struct Endpoint {
  std::string address;
  std::uint16_t port = 0;

  // "ADDRESS:PORT" (e.g. "198.18.0.10:7900"); Errc::invalid_argument naming the text otherwise.
  static Endpoint parse(std::string_view text);
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
  // refused as version_from_future (its sidecar has not heard of the takeover yet) is too;
  // and how long writes to the replica it failed over to are reported lost while that replica
  // is not promoted (its server lives: our link to it failed) before wait_push() throws
  // Error(unreachable) — out_of_reach(), so the caller can connect to the running job again.
  Millis failover_patience{5000};
  std::uint32_t server_endpoint = 0;
  // The tensor this worker pushes: the shard's (ShardOptions::tensor), checked when it connects
  // to the server and to the replica; also the tensor id of its sidecar requests.
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
  bool dropped = false;                   // never sent (pull again): too stale for the sidecar's
                                          // τ, or its round at the server was full (direct mode,
                                          // ShardOptions::round)
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
  // ShardOptions::clock_workers: the slowest worker's clock when the model was read (else 0).
  std::uint64_t slowest_clock = 0;
};

// Whether an error from a Worker or an Aggregator says its server and replica are out of reach
// (a link down, a host gone, a port closed; in sidecar mode also a server that lives behind a
// failed link while the replica we failed over to is not promoted) rather than a mistake of its
// own or a peer's: the case in which a new connection to the running job (rejoining it) can help.
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
  // Throws Error(invalid_argument) when the server refuses the request: `computed_on` is ahead
  // of every version it granted (unless this worker failed over within failover_patience: then
  // lost), or the server is this shard's replica and its primary lives (WorkerOptions::server
  // names the replica).
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
  // ShardOptions::clock_workers (stale-synchronous parallel): the slowest worker's clock, with
  // one 8-byte READ of the shard's header. 0 if the server keeps no clocks.
  std::uint64_t slowest_clock();
  // Times this worker switched its server to the replica.
  std::uint64_t failovers() const;
  // A restarted worker, before it resumes (ps-lite's recovery): the last push of this worker id
  // the server took — its doorbell accepted, so it is or will be applied — or nullopt if none.
  // The previous life may have died between its write and hearing that it landed; pushing that
  // step again would apply it twice. Ask before the first push: a push of this life counts too.
  // Direct or sidecar mode, pushing to the server; a promoted replica answers as its server
  // would have. Pushes through an aggregator: invalid_argument (the server does not learn the
  // tag of a push there).
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
  // sidecar's grant), mirrored to the replica; a server failure fails over (lost = true; past
  // failover_patience at a replica not promoted, Error(unreachable)). Not
  // written (lost = true) if the server has decided that sequence already: it skipped it, its
  // hole_timeout having passed while the aggregator waited for members or was stalled.
  // The sequence is claimed before the write with `token`, the aggregate grant's
  // (sidecar::Grant::token; 0 at a server without grant windows, whose answer then holds the
  // sequence for this connection until its write).
  PushResult write_as(std::uint64_t sequence, std::uint64_t token = 0);
  // The aggregator's forward in direct mode: tells the server where the aggregator listens, so
  // workers that lost it (it was restarted) come back to it.
  void announce_aggregator(const std::string& address, std::uint16_t port);
  std::unique_ptr<State> state_;
};

}  // namespace gradlane::ps
