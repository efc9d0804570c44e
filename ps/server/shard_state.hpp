// The state of a ShardServer (shard_server.cpp), shared by the files that implement it:
// shard_server.cpp (input, grants, the loop), shard_apply.cpp (applying in order),
// shard_claims.cpp (grant windows and claims), shard_sidecar.cpp (the sidecar's side),
// shard_replica.cpp (the replica's side: following decisions — ReplicaFollower's bookkeeping —,
// promotion, taking a sidecar's sequence over) and shard_membership.cpp (accepting workers, late joiners, probing idle
// ones). Internal to the library.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "common/monotonic.hpp"
#include "gradlane/ps/server.hpp"
#include "ps/receiving/apply_order.hpp"
#include "ps/protocol/join.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/model_version.hpp"
#include "ps/receiving/outstanding_grants.hpp"
#include "ps/receiving/worker_clocks.hpp"
#include "ps/protocol/regions.hpp"
#include "ps/server/replica_follower.hpp"

namespace gradlane::ps {
namespace shard {

using Clock = std::chrono::steady_clock;

struct Peer {
  Connection conn;
  PeerKind kind = PeerKind::worker;
  std::uint32_t worker = 0;
  bool alive = true;
  // Server: sequences granted to this worker whose doorbell has not come yet.
  OutstandingGrants outstanding;
  // Grant windows: the window of each outstanding grant, and spares to bind again. Declared
  // after the connection, so they go first.
  std::map<std::uint64_t, MemoryWindow> windows;
  std::vector<MemoryWindow> spare_windows;
  bool said_bye = false;                    // the worker (or, at a replica, the server) said it finished: a leave
  bool told_primary = false;                // replica: the primary heard this worker failed over to us
  bool joined_late = false;                 // admitted after accept_peers (a restarted worker or aggregator)
  Addressed addressed = Addressed::server;  // what the worker connected to us as (its Hello)
  // Sidecar mode: what it said it writes as each sequence whose doorbell we have not taken yet
  // (its write completes when our NIC has it, so it may say the next before we take this one).
  std::map<std::uint64_t, Pushing> pushing{};
};

struct Waiting {
  std::size_t peer = 0;
  Request request;
};

struct GrantInfo {
  std::uint32_t worker = 0;
  std::uint64_t tag = 0;
  std::uint64_t computed_on = 0;
};

}  // namespace shard

struct ShardServer::State {
  State(const Device& dev, Role r, std::uint16_t port, const ShardOptions& o)
      : role(r),
        options(o),
        device(dev),
        shard(dev, o.floats),
        // Grant windows, in either role: a promoted replica grants with them, and a replica's
        // mirror slots open only to the worker that claims them.
        slots(dev, o.floats, o.slots, o.grant_windows),
        writer(shard.header(), shard.floats()),
        order(o.slots, 1),
        cq(dev, 1024, o.shared_receives, o.transport.max_message_bytes),
        listener(dev, port, o.transport) {
    // One completion queue for every connection (workers, primary, replica): a round polls it
    // once instead of once per connection, and an idle server can sleep on it (wait()).
    listener.use_completion_queue(cq);
    if (o.clock_workers > 0) clocks.emplace(o.clock_workers);
    if (o.grant_windows) {
      if (!dev.info().memory_windows) {
        throw Error(Errc::unsupported, fmt::format("grant_windows: {} has no type-2 memory windows; without them any "
                                                   "worker may write any slot of the ring",
                                                   dev.info().name));
      }
    }
  }

  Role role;
  ShardOptions options;
  Device device;
  ShardRegion shard;
  SlotRing slots;
  std::vector<float> velocity;  // momentum state, when momentum > 0
  // Per slot, when its update's doorbell was taken (AppliedUpdate::doorbell_ns): the slot
  // stays busy in `order` until that update is applied, so no later doorbell overwrites it.
  std::vector<std::int64_t> doorbell_ns;
  ShardWriter writer;
  ApplyOrder order;
  CompletionQueue cq;
  Listener listener;
  std::vector<shard::Peer> peers;
  std::optional<LateJoins> late;  // after accept_peers (or join_server): who joins from progress()
  void start_admitting();
  ServerStats stats;
  std::vector<AppliedUpdate> history;
  std::optional<WorkerClocks> clocks;  // ShardOptions::clock_workers, published in the header

  // ---- server ----
  std::optional<Connection> replica;
  bool had_replica = false;  // a replica was connected at some point (cut_off())
  // Workers lost (not a leave) and not back yet, and when: finished() waits options.rejoin_grace
  // past each loss for that worker to come back.
  std::map<std::uint32_t, shard::Clock::time_point> awaiting_rejoin;
  // A replica that joined running: the model copy it reads, kept until its first ack; where it
  // listens, told to every worker (they connect to it, mirror there, fail over to it).
  std::optional<ModelSnapshot> snapshot;
  std::optional<ListeningAt> replica_at;
  // Aggregators (connected as workers: by that id) that said where they listen; direct mode.
  std::map<std::uint32_t, ListeningAt> aggregators_at;
  // Sidecar mode: the sidecar owns the sequence; we take its cancels and report progress.
  std::optional<sidecar::Client> sidecar;
  // Its gradlaned is gone (a call threw): nobody grants our sequence. The destructor then
  // leaves without the drain — each round of it would wait the attach timeout again — and the
  // replica takes over as after a crash (its promotion applies every acknowledged mirror).
  bool sidecar_lost = false;
  std::uint64_t reported = 0;                         // last `through` sent with Client::applied
  std::map<std::uint64_t, std::uint32_t> rung_by;     // sequence -> worker whose doorbell brought it
  std::map<std::uint64_t, Pushing> pushed;            // sequence -> what its worker said it was
  std::map<std::uint32_t, std::uint64_t> arrivals;    // worker -> updates arrived from it
  std::optional<shard::Clock::time_point> gap_since;  // head missing while later updates wait
  // Promoted in sidecar mode: sequences below this were the old owner's to grant (skipped).
  std::uint64_t skip_below = 0;
  // Grant windows: the key of our grants' tokens — drawn by a server (in sidecar mode its
  // gradlaned stamps them), told to a replica by its server (ReplicaKey) — and each claimed
  // sequence's claimant (index in peers) until its doorbell, cancel, skip or apply.
  std::optional<sidecar::GrantKey> grant_key;
  std::map<std::uint64_t, std::size_t> claimed;
  // Slots open only to claimants: our ring is windowed and we know the key to check claims.
  bool windowed() const noexcept { return options.grant_windows && grant_key.has_value(); }
  // Direct mode: this server owns the sequence.
  std::deque<shard::Waiting> waiting;
  std::uint64_t next_grant = 1;
  std::map<std::uint64_t, shard::GrantInfo> granted;  // granted, not yet applied or skipped
  // Direct mode: each worker's last update taken here — its doorbell accepted (server), or
  // applied as the server decided it (replica, so a promoted one knows too). A restarted worker
  // asks for it (AskLanded) before it resumes: its last push may have landed unheard.
  std::map<std::uint32_t, Landed> landed;
  void note_landed(std::uint32_t worker, const Landed& update);

  // ---- replica ----
  std::optional<std::size_t> primary;  // index in peers
  RegionDescriptor primary_slots;      // the server's ring: where a lost mirror is re-read
  // The server's decisions and the mirrors that came; after a promotion, the decisions fed
  // until they are applied.
  ReplicaFollower following;

  void lose(shard::Peer& peer, const Error& why);
  void tell_primary_failed_over(shard::Peer& worker);
  std::uint32_t open_window(shard::Peer& peer, std::uint64_t sequence);
  void close_window(shard::Peer& peer, std::uint64_t sequence);
  void answer_claim(std::size_t index, const Claim& claim);
  void answer_mirror_claim(std::size_t index, const Claim& claim);  // replica
  void check_token(const shard::Peer& peer, const Claim& claim, const char* what);
  [[noreturn]] void refuse_claim(const shard::Peer& peer, const Claim& claim, const char* what, std::string_view why);
  void open_claim(std::size_t index, std::uint64_t sequence);
  bool rung_by_claimant(shard::Peer& peer, std::uint64_t sequence);
  void take_replica_key(const ReplicaKey& key);  // replica
  ReplicaKey replica_key() const;                // server: what to tell it
  void close_claim(std::uint64_t sequence);      // its window and its claimant's outstanding entry
  Admit cancel(std::uint64_t sequence);          // order.cancelled, closing its claim
  std::size_t take_doorbells(shard::Peer& peer);
  void promote();
  std::size_t take_input();
  std::size_t take_from(std::size_t index);
  std::size_t grant();
  std::size_t decide_head();  // replica
  std::size_t apply();
  std::size_t expire_holes();
  std::size_t take_sidecar();
  std::size_t skip_stuck_head();
  std::size_t skip_old_owners_sequences();
  void fence_old_owners_sequences();
  void take_over_at_sidecar();
  bool take_own_sequence_over(const Error& lost);
  void take_every_doorbell_here();
  void probe_idle_peers();
  void advertise(Connection& conn);
  std::size_t admit_joiners();
  void admit(Connection&& conn, const Hello& hello);
  void adopt_replica(Connection&& conn);  // moved from only when adopted
  void lose_replica(const Error& why);
  // Where `at` listens, to every live worker but `except` (the aggregator it describes), or
  // only to `only` (a worker admitted later).
  void tell_workers(const ListeningAt& at, std::uint32_t except = 0, shard::Peer* only = nullptr);
  std::uint32_t rounds = 0;  // progress() calls, to read the clock only so often
  IdleProbe idle_probe;      // probe_idle_peers
  void report_applied();
  void tell_replica(const AppliedUpdate& record);
  void send_to_replica(const Message& message);       // a failure loses the replica
  void drop_as_the_server_did(std::uint32_t worker);  // replica: Dropped
  void apply_update(std::uint32_t slot);
  // Between chunks of an apply: what must not wait for a whole apply.
  void between_chunks();
};

}  // namespace gradlane::ps
