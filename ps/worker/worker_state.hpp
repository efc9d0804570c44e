// Worker::State: what a ps::Worker holds and does (include/gradlane/ps/worker.hpp is its
// interface). Its member functions live by concern: worker_links.cpp (connections, failover,
// joining), worker_grants.cpp (asking for a grant, taking the answer: direct mode),
// worker_write.cpp (writing a granted push); worker.cpp is the public API over it. A
// sidecar-mode worker's grants are SidecarGrants' (sidecar_grants.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "gradlane/ps/worker.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"
#include "ps/worker/aggregator_link.hpp"
#include "ps/worker/replica_link.hpp"
#include "ps/worker/sidecar_grants.hpp"

namespace gradlane::ps {

using Clock = std::chrono::steady_clock;

struct Worker::State {
  State(const Device& dev, const WorkerOptions& o);
  // How long the constructor tries to reach a peer (WorkerOptions::connect_within).
  static Millis connect_bound(const WorkerOptions& o);
  ~State() { say_goodbye(); }  // before the connections close
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  Device device;
  WorkerOptions options;
  std::size_t bytes;
  Buffer gradient_buffer;
  MemoryRegion gradient_region;
  Buffer model_buffer;
  MemoryRegion model_region;
  Connection server;
  RegionDescriptor server_slots, server_shard;
  ReplicaLink replica;  // after the server's regions: it checks its ring against them
  // Direct mode with an aggregator: requests, grants and the one write go there (no mirror:
  // the aggregator's forward is mirrored); pulls stay with the server.
  AggregatorLink aggregator;
  std::uint64_t failovers = 0;
  std::uint64_t failovers_at_pull = 0;              // `failovers` when the last pull read its version
  std::optional<Clock::time_point> failed_over_at;  // the last failover
  std::uint64_t bytes_copied = 0;                   // Worker::bytes_copied()

  Connection& push_target() { return aggregator.up() ? aggregator.connection() : server; }

  // After an error: if the server's connection failed and the replica's is alive, the replica
  // (which promotes itself when it loses the server) is the server from now on; if only the
  // replica failed, go on without mirroring. Returns false when nothing can take over.
  bool recover();
  // Sidecar mode: the server sends a worker nothing but where a restarted aggregator listens
  // (ListeningAt); read at each push, without waiting. A failure here is left for the push to
  // meet (its write fails over), as it would be unread otherwise.
  void take_server_notices();

  // Where a replica that joined, or a restarted aggregator, listens (the server told us).
  void take_listening_at(const ListeningAt& at);

  // This worker is a sidecar-mode aggregator's forward (write_as): its sequences are a
  // sidecar's, as a sidecar-mode worker's are, though it has no sidecar client of its own.
  bool sidecar_forward = false;

  std::uint32_t slots = 0;
  bool push_in_flight = false;
  std::optional<SidecarGrants> sidecar;  // sidecar mode
  // The push in flight, to ask again for a grant that came too late (grant_lifetime).
  std::uint64_t push_tag = 0;
  std::uint64_t push_computed_on = 0;
  std::uint64_t job_remaining = 0;  // declared with each request (set_job_remaining)
  Clock::time_point requested_at{};

  // Asks the server (or the aggregator), or the sidecar, for a grant for the push in flight.
  void send_request();

  // A grant is too old to write once `since` (direct mode: when the worker last saw its queue
  // empty before the grant; sidecar mode: its slot's start) is more than grant_lifetime ago; asks again then, up to
  // kMaxGrantRequests in all. Returns false when the push has asked often enough and is to be reported lost.
  static constexpr std::uint32_t kMaxGrantRequests = 3;
  bool too_late(Clock::time_point since, std::uint32_t& expired);

  // Past this, a grant taken up at `since` (see too_late) is too old to write.
  Clock::time_point write_by(Clock::time_point since) const { return since + options.grant_lifetime; }

  // Whether this push mirrors to a replica.
  bool mirroring() const { return replica.up() && options.mirror; }
  // Grant windows: shows the grant's token to the replica as well, ahead of the mirror (its
  // answer is taken in write()). True if it was sent.
  bool claim_mirror(std::uint64_t sequence, std::uint64_t token);
  // Sidecar mode (a push, or an aggregator's forward), with grant windows or without them (a
  // token of 0): claims the server's slot and, with a token, the mirror's (their answers are
  // taken in write_claimed). True if the mirror's was sent.
  bool send_claims(std::uint64_t sequence, std::uint64_t token);

  // Writes the gradient into the slot of `sequence` at the replica, then at the server; in
  // direct mode with an aggregator, into the aggregator's member slot instead. Past `deadline`
  // (the grant's arrival or its slot's start, plus grant_lifetime) nothing more goes to the
  // server: the push is lost, not written (PushResult::sequence 0). A nonzero
  // `window_rkey` (the server's grant windows) opens that slot alone at the server. `token`:
  // the grant's (grant windows), and `mirror_claimed`: the replica was sent a claim for its
  // slot with it (claim_mirror), whose answer opens it.
  PushResult write(std::uint64_t sequence, Clock::time_point deadline, std::uint32_t window_rkey = 0,
                   std::uint64_t token = 0, bool mirror_claimed = false);

  // Sidecar mode: a server that took a sequence over — a promoted replica, or a server whose
  // gradlaned was restarted — refuses the sequences the old owner may have granted (ps.hpp),
  // silently, as a doorbell has no answer. Its header says from where on it takes them; READ
  // after our write on the same QP, it reflects at least the moment our write arrived (the
  // takeover publishes it before taking the doorbells already there). A refused push is lost,
  // not acknowledged. Read on every push: a worker cannot know whether its server took its own
  // sequence over (at a restarted gradlaned).
  // `at`: where in our header copy the floor was READ.
  bool refused_below_floor(std::uint64_t sequence, std::size_t at) const { return sequence < header_copy_word(at); }
  // Sidecar mode, after a failover: the floor READ behind our write at the former replica is 0
  // when it was never promoted — our link to the server failed while the server lives, and
  // the server's sidecar still grants its sequence. The replica applies only what the server
  // decided, and the server never saw this write, so the push is lost (its grant is completed
  // as failed and the server skips the sequence at once): said here. Within failover_patience
  // that may be a promotion under way; past it, Error(unreachable): the caller reconnects to the
  // running job (rejoin) rather than writing where nothing applies.
  void wrote_to_unpromoted_replica(std::uint64_t sequence);
  // A word of our copy of a shard header, where a READ of one header word landed.
  std::uint64_t header_copy_word(std::size_t at) const;
  // The word at byte `at` of the server's shard header, by one READ (failing over to the
  // replica if the server is gone).
  std::uint64_t read_server_header_word(std::size_t at);

  // Writes the gradient into member slot `slot` of the aggregator's ring, doorbell `imm`.
  PushResult write_member(std::uint64_t slot, std::uint32_t imm);

  // Sidecar mode: the claim of `sequence` went out (and, if
  // `mirror_claimed`, the replica's); the server's answer is the key of a window over that one
  // slot on our connection (without windows, the ring's key, the sequence held for us), then we
  // write. Key 0: the server decided that sequence already (skipped it: our grant came too
  // late), so the push is lost, not written.
  PushResult write_claimed(std::uint64_t sequence, Clock::time_point deadline, std::uint64_t token,
                           bool mirror_claimed);

  // The answer to a claim of `sequence` on `conn` (a server's or a replica's): the key that
  // opens its slot to us, or 0 when it decided that sequence already. An answer to another
  // claim is one from before a failover (a mirror's claim, its replica since promoted): passed.
  std::uint32_t await_window(Connection& conn, std::uint64_t sequence);

  PushResult decided_before_claim(std::uint64_t sequence, const char* where) const;

  // Direct mode: the next message on `target`, and when its receive queue was last seen empty
  // before it (at the latest, the request): the message arrived after that, so this bounds how
  // long it waited here unread — the worker stalled, or the app took its time between
  // start_push() and wait_push() — on this host's clock alone. Neither a slow server nor a
  // grant that waited there for a free slot counts.
  std::pair<Message, Clock::time_point> receive_noting_arrival(Connection& target);

  PushResult wait_direct();

  static PushResult lost_push();
  // Within failover_patience of this worker's last failover.
  bool failing_over() const { return failed_over_at && Clock::now() - *failed_over_at < options.failover_patience; }

  // The server refused the request: computed on a version it has not reached. After a failover
  // the model came from a server that got further than its promoted replica: the push did not
  // happen, the caller pulls the new server's model. Otherwise the application's error.
  PushResult refused_push(const Connection& target, const Refused& refused);

  static PushResult expired_push(std::uint32_t expired);

  // Tells every peer this worker finished, so that its disconnect counts as a leave, not a
  // loss. Bounded: a peer that does not acknowledge within a second is left to its timeouts.
  void say_goodbye() noexcept;

  // Learns a shard's regions on `conn` and says who we are.
  std::pair<RegionDescriptor, RegionDescriptor> join(Connection& conn, Addressed as);
};

}  // namespace gradlane::ps
