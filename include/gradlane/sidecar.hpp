// gradlane — the sidecar client: how an application asks the host's gradlaned when each
// gradient update may use the network.
//
//   auto sidecar = gradlane::sidecar::Client::attach({.job = 7, .endpoint = 1,
//                                                     .region_bytes = grads.size()});
//   auto id = sidecar.request({.tensor = 3, .receiver = 9, .bytes = n, .region_offset = off,
//                              .computed_on = model_version, .gradient_norm = norm});
//   gradlane::sidecar::Grant g = sidecar.wait(std::chrono::seconds(1));
//   switch (g.kind) { case GrantKind::go: ... write part to g.target at g.slot_start ...
//                     sidecar.complete(g.request, g.part_index, wire_time); }
//
// The client and gradlaned share a memory segment (name: AttachOptions::shm_name); requests
// and grants cross it through lock-free queues, so a request/grant round trip costs a few
// hundred nanoseconds, not a system call (perf/sidecar measures it).
//
// Every request gets answers, never silence: each part of it gets exactly one go / redirect /
// drop, or the whole request gets one error. If gradlaned restarts, the client reattaches to
// the new daemon on its next call and answers every request the old daemon still owed with a
// Grant{kind = error, reason = sidecar_restarted}; the application resubmits them.
//
// Threading: a Client is one producer and one consumer of its queues — use it from one thread
// at a time (one Client per thread that talks to the sidecar is fine; each takes an app slot).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "gradlane/error.hpp"

namespace gradlane::sidecar {

// GRADLANE_SIDECAR_SHM if set, else "/gradlane-<uid>" (one daemon per host and user).
std::string default_shm_name();

// ---- grant tokens: a worker writes only the slot it was granted ----
// Whoever holds a region's rkey can write anywhere in it, and in sidecar mode the server does
// not know to whom a sequence was granted. A server app that gives gradlaned a secret key
// (AttachOptions::grant_key) has every go and aggregate grant of its receiver stamped with
// grant_token(key, sequence) (Grant::token): by its own gradlaned for apps of its host, and
// through the peer protocol for apps elsewhere. The grantee shows the token to the server
// before writing; the server, which holds the key, binds a memory window over that one slot
// for the connection that showed it (ps::ShardOptions::grant_windows does all of this). Only
// the grantee's and the owner's sidecars learn a sequence's token; one sequence's token says
// nothing about another's (SipHash-2-4, a keyed pseudo-random function, via libsodium).
using GrantKey = std::array<std::uint8_t, 16>;
// 16 bytes from the kernel's random source. Throws Error(resource_exhausted) if libsodium
// cannot be initialised.
GrantKey random_grant_key();
// The token of `sequence` under `key`: never 0 (0 means "no token").
std::uint64_t grant_token(const GrantKey& key, std::uint64_t sequence) noexcept;

struct AttachOptions {
  // Segment name (a POSIX shm name: "/name"). GRADLANE_SIDECAR_SHM overrides the default.
  std::string shm_name = default_shm_name();
  std::uint32_t job = 0;           // the training job (tenant) this application belongs to
  std::uint32_t endpoint = 0;      // the host NIC it sends from (scheduler endpoint id)
  std::uint64_t region_bytes = 0;  // size of its gradient region; request offsets must fit in it
  // Bound on attach (and on a transparent reattach): how long to wait for a daemon that is
  // starting or restarting before giving up with Error(sidecar_unavailable).
  // from_env(): GRADLANE_SIDECAR_TIMEOUT_MS.
  std::chrono::milliseconds attach_timeout{2000};
  // How long wait() spins before sleeping on the futex. A grant usually arrives within a few
  // microseconds of a request, so a short spin saves the ~5-20 us of a futex wake-up;
  // 0 sleeps at once (lowest CPU). from_env(): GRADLANE_SIDECAR_SPIN_US.
  std::chrono::microseconds spin{50};
  // Failover: a replica promoted to be `endpoint`'s server attaches with the version it took
  // over at (every sequence <= it decided there). The daemon — which must have been started
  // with `--standby endpoint:job` — then owns that receiver's sequence, hands it out from
  // take_over_at + 1, and tells its peers (the old owner drops what it had pending: Reason::
  // receiver_moved). Refused with Reason::bad_takeover otherwise. Only the first attach takes
  // over: a transparent reattach to a restarted daemon is a plain attach.
  std::optional<std::uint64_t> take_over_at;
  // A server app (attached as its receiver's endpoint) whose updates land in `slots` reused
  // slots (sequence % slots, ps::ShardOptions::slots): gradlaned never grants one of its
  // sequences more than `slots` past what it reported applied (Client::applied), or a write
  // could land in a slot still holding an update not yet applied. 0: no such limit. An app
  // with slots never reattaches: its sequence died with its daemon, and a new one would hand
  // it out again from 1; it gets Error(sidecar_unavailable) instead.
  // An app that declares slots (or takes over) is its receiver's server app: the only one that
  // reports applied() and is told cancels. While it is attached, an app of another job that
  // does the same for that endpoint is refused (Reason::receiver_of_another_job).
  std::uint32_t slots = 0;
  // A server app (slots or take_over_at set) that binds a window per grant: gradlaned stamps
  // its receiver's grants with tokens of this key (grant_token). Refused (Error
  // invalid_argument) on an app that is not a server app.
  std::optional<GrantKey> grant_key;

  // Defaults with the GRADLANE_SIDECAR_* overrides applied; throws Error(invalid_argument)
  // naming the variable for a malformed value.
  static AttachOptions from_env();
};

// One gradient update the application wants to send.
struct Update {
  std::uint32_t tensor = 0;
  std::uint32_t receiver = 0;  // endpoint id of the server holding the tensor's shard
  std::uint64_t bytes = 0;
  std::uint64_t region_offset = 0;  // where the gradient starts in the registered region
  std::uint64_t computed_on = 0;    // server model version the gradient was computed on
  float gradient_norm = 0.0F;
  std::uint32_t priority = 0;  // lower = earlier layer = needed first
  // Bytes this job still has to send, this update included (e.g. steps left × update bytes ×
  // workers); 0 = not declared. Where several jobs share a NIC, gradlaned serves the one with
  // the least work left first (MLNet's prioritization: the average job completion time drops);
  // a backlogged job still gets its floor share (SchedulerConfig::tenant_floor_share).
  std::uint64_t job_remaining = 0;
  // This app cannot write to an aggregator (it has none, or lost its connection to it): the
  // update goes to the server or is dropped, never redirected. (A ps::Worker sets it itself.)
  bool direct_only = false;
};

enum class GrantKind : std::uint8_t {
  go = 1,         // write the part to `target` (the server) starting at slot_start
  drop = 2,       // do not send this part; reason says why: stale (pull a fresh model) or
                  // peer_lost (the receiver's sidecar was lost; the model is not stale)
  redirect = 3,   // write the part to `target` (an aggregator) instead; sequence = aggregate id
  aggregate = 4,  // this app aggregates: forward the sum of aggregate `request` to `target`
  error = 5,      // the request was refused (reason says why); nothing of it was scheduled
  cancel = 6,     // to a server app: sequence `sequence` at `target` was granted but will never
                  // be written (its sender failed or left); skip it in order. request = 0. With
                  // reason peer_lost, its sender's sidecar was lost, not (known) the sender: a
                  // write of it may still come
};

enum class Reason : std::uint8_t {
  none = 0,
  stale = 1,  // drop: applied next it would already exceed the staleness bound
  // drop: the sidecar that owns the receiver's sequence (on another host) was lost before it
  // decided this part. part_offset/part_bytes are the part's bytes when the daemon knows the
  // split (some parts were answered), else the whole update (part 0 of 1). Nothing about the
  // model is stale: do not re-pull; a new request to that receiver is refused with
  // receiver_unreachable until its sidecar is back (gradlaned restarted with the peer).
  peer_lost = 2,
  // drop: the receiver's server failed over to its replica, whose host's sidecar now hands out
  // the sequence, before this part was decided. Not stale and not lost for good: the push did
  // not happen; a new request goes to the new owner (the same receiver id).
  receiver_moved = 3,
  // drop: the receiver's sidecar (on another host) would not hold the request: larger than it
  // takes from a peer (its --max-update-bytes), or too many requests or bytes already pending
  // there from this host. Not stale: the push did not happen; a later request may be taken.
  peer_refused = 4,
  unknown_job = 10,           // error: the entry names a job this app did not attach as
  bad_size = 11,              // error: zero bytes, or more than the daemon's --max-update-bytes
  bad_offset = 12,            // error: [region_offset, +bytes) is outside the app's region
  bad_format = 13,            // error: unknown entry format or operation
  unknown_fields = 14,        // error: reserved fields/flags are set (a newer client?)
  bad_value = 15,             // error: e.g. a NaN gradient norm
  duplicate_request = 16,     // error: that request id is still outstanding
  unknown_request = 17,       // error: complete() for a request/part that was never granted
  too_many_outstanding = 18,  // error: the app has too many unanswered/uncompleted requests, or bytes
  bad_receiver = 19,          // error: the receiver is the app's own endpoint
  // error (or, answered by the receiver's sidecar on another host, drop): computed_on is ahead
  // of the server's sequence (re-pull the model; after a failover the push did not happen)
  version_from_future = 20,
  // error: the receiver's sequence is owned by a peer sidecar whose link failed; this sidecar
  // does not schedule it in its place (two owners would hand out the same sequence number).
  receiver_unreachable = 21,
  // error: no sidecar serves the receiver endpoint (not one of this gradlaned's --endpoint ids
  // nor any peer's). Only a gradlaned started with --endpoint checks; one without serves all.
  unknown_receiver = 22,
  sidecar_restarted = 30,  // error (made by the client): the daemon that owed this restarted
  // Attach refusals / evictions (reported as exceptions, not grants):
  bad_attach = 40,        // region_bytes == 0 or an unreadable identity
  owner_mismatch = 41,    // the pid/start time in the slot is not the process that claimed it
  corrupt_ring = 42,      // the app's queue indices were overwritten
  unknown_endpoint = 43,  // AttachOptions::endpoint is not one of the daemon's --endpoint ids
  // AttachOptions::take_over_at for an endpoint this daemon was not started to stand by for
  // (--standby), or one it cannot take over (a daemon without a scheduler).
  bad_takeover = 44,
  // The job has a segment of its own (gradlaned --job-user) and this attach came through
  // another one: the shared segment, or another job's.
  own_segment = 45,
  // An app of another job is attached as this endpoint's server (it declared its slots or took
  // the sequence over): one receiver's sequence serves one job. Apps of any job may still
  // attach from that endpoint to send.
  receiver_of_another_job = 46,
};
std::string_view reason_name(Reason reason) noexcept;
std::string_view kind_name(GrantKind kind) noexcept;

// An answer from the sidecar. Slot times are CLOCK_MONOTONIC of this host, i.e. comparable
// with std::chrono::steady_clock::now().time_since_epoch() in this process.
struct Grant {
  std::uint64_t request = 0;  // the id request() returned (aggregate: the aggregate id)
  GrantKind kind = GrantKind::error;
  Reason reason = Reason::none;
  // go/aggregate: server endpoint; redirect: aggregator endpoint; error: which call was
  // refused (1 request, 2 complete, 3 complete_aggregate).
  std::uint32_t target = 0;
  std::uint64_t sequence = 0;  // go/aggregate: the server applies it as update `sequence`
  std::chrono::nanoseconds slot_start{0};
  std::chrono::nanoseconds slot_length{0};
  std::uint64_t part_offset = 0;  // bytes [part_offset, part_offset + part_bytes) of the tensor
  std::uint64_t part_bytes = 0;
  std::uint32_t part_index = 0;
  std::uint32_t part_count = 1;  // aggregate: number of members summed
  // go/aggregate to a server that gave gradlaned a grant key: grant_token(key, sequence), to
  // show the server before writing (it then opens that slot to this connection). 0: none.
  std::uint64_t token = 0;
};

class Client {
 public:
  // Attaches to the daemon serving options.shm_name. Throws Error(sidecar_unavailable) within
  // options.attach_timeout if no daemon serves it (naming the command that starts one),
  // Error(resource_exhausted) if all its app slots are taken, Error(protocol) on a layout
  // version mismatch, Error(invalid_argument) for unusable options.
  static Client attach(AttachOptions options);

  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();  // detaches

  // Queues a request and returns its id (grants carry it). If the queue to the sidecar is
  // full, waits up to `wait_for_space` for room, then throws Error(resource_exhausted): an
  // entry is never dropped silently. Throws Error(sidecar_unavailable) if the daemon is gone
  // and no new one answers within attach_timeout.
  std::uint64_t request(const Update& update, std::chrono::nanoseconds wait_for_space = std::chrono::nanoseconds{0});
  // Reports that granted part `part` of `request` (or aggregate `request`, for kind
  // aggregate) reached its target; `wire_time` (post to completion) refines the daemon's
  // bandwidth estimates. Same full-queue behaviour as request().
  void complete(std::uint64_t request, std::uint32_t part, std::chrono::nanoseconds wire_time, bool failed = false,
                std::chrono::nanoseconds wait_for_space = std::chrono::nanoseconds{0});
  void complete_aggregate(std::uint64_t aggregate, std::chrono::nanoseconds wire_time, bool failed = false);
  // A server app (attached as its receiver's endpoint): every sequence <= `through` is applied
  // at the server and at its replica, so their slots may be granted again (the window B).
  void applied(std::uint64_t through);

  // The next answer, if one is waiting. Never waits for one; it blocks only to reattach after
  // gradlaned restarted (at most attach_timeout).
  std::optional<Grant> poll();
  // The next answer; spins for AttachOptions::spin, then sleeps without using a core.
  // Throws Error(timeout) if none arrives in `timeout`. Notices a dead daemon within ~50 ms
  // and reattaches (which may take up to attach_timeout, then Error(sidecar_unavailable)).
  Grant wait(std::chrono::nanoseconds timeout);

  // Leaves the sidecar (the daemon forgets this app's pending requests). Idempotent.
  void detach() noexcept;

  bool attached() const noexcept;
  std::uint32_t slot() const noexcept;                // which app slot this client holds
  std::uint64_t sidecar_generation() const noexcept;  // changes when gradlaned restarts
  std::uint64_t reattachments() const noexcept;       // transparent reattaches so far
  std::size_t outstanding() const noexcept;           // requests still owed an answer

  struct State;  // the attachment (internal)

 private:
  friend struct ClientInternals;  // sidecar/client/internals.hpp: raw entries for tests
  explicit Client(std::unique_ptr<State> state) noexcept;
  std::unique_ptr<State> state_;
};

}  // namespace gradlane::sidecar
