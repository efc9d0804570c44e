// The parameter server's control messages (SEND/RECV over the shard's connections): fixed-size
// little-endian records, one per message. Control traffic only — gradients never travel here.
//
//   Hello     peer → shard    who is on this connection: a worker (its id) or the primary
//   Request   worker → server a slot for the worker's next update
//   Grant     server → worker the sequence number the update will be applied as, and with
//                             grant windows the key of a window over that one slot
//   Decided   server → replica what the server did with a sequence: applied (with the
//                             worker it came from) or skipped; in sequence order
//   Ack       replica → server every sequence up to `through` is applied at the replica
//   Bye       worker → shard, aggregator  the worker finished: its disconnect is a leave, not a
//                             loss (a worker that goes without it was lost, and is reported)
//             server → replica  the server finished the job (id 0): not a crash to fail over from
//   FailedOver replica → server a worker asked the replica for a slot while the server lives:
//                             its link to the server failed; the server steps down
//   Adopted   server → a replica that joined it running: it is this server's replica from
//                             `version` on (the snapshot it was advertised is that version);
//                             every decision after it follows as Decided
//   ListeningAt replica → server  where a replica that joined running listens (after its
//                             hello); aggregator → server (on its forward's connection): where
//                             the aggregator listens, said at its start;
//             server → worker   the same, so the worker connects to it: to a replica, which it
//                             mirrors to and fails over to; to an aggregator, when it has lost
//                             its own (a restarted aggregator: it pushes through it again)
//   Mirroring worker → replica  the worker mirrors its updates here from sequence `from` on (a
//                             worker that connected to a joined replica): the replica waits for
//                             those mirrors, and reads the earlier ones from the server's slot
//   Forwarded aggregator → worker  what became of a member the aggregator took: summed into
//                             the update the server applies as `sequence` (delivered), or its
//                             forward was lost; the member's push is acknowledged only now
//   Claim     worker → server (sidecar mode, grant windows): the token its sidecar stamped on
//                             its grant of `sequence`; the server answers Opened, whose
//                             window opens that slot to this connection (window 0: the
//                             sequence is decided already, nothing to write). Token 0 (an
//                             aggregator's forward, no windows): the ring's key, and the
//                             sequence is held for this connection until its write
//             worker → replica (grant windows, either mode): the same for the mirror's slot
//   ReplicaKey server → replica  the key of the grant tokens (grant windows), or none
//   Opened    server/replica → worker  the answer to a Claim: the key of the window over the
//                             claimed slot, or 0 (decided already: write nothing)
//   AskLanded worker → server  which of my updates landed last? (a restarted worker, before it
//                             resumes: its last push may have been taken without it hearing so)
//   Landed    server → worker  the answer: the tag, sequence and computed_on of the last update
//                             of that worker id the server took (its doorbell accepted: it is
//                             or will be applied), or sequence 0 (none); in sidecar mode from
//                             what the worker said ahead of its write (Pushing)
//   Pushing   worker → server (sidecar mode) the update it writes next as `sequence` (its
//                             sidecar's grant): its tag and version, which the doorbell cannot
//                             carry, so the server can answer AskLanded as in direct mode
//             worker → replica (sidecar mode) the same ahead of its mirror: a replica promoted
//                             before the server decided that sequence names it right
//   Dropped   server → replica  the server dropped this worker's connection (it held a claimed
//                             sequence unwritten past ten hole timeouts, sidecar mode without
//                             grant windows): the replica drops it too, before the skip that
//                             follows, so its late mirror cannot land in a slot reused since
//   Refused   server → worker  a Request it will not grant, and why: computed on a version
//                             ahead of every one granted here (a model from another server,
//                             or pulled before a failover from a server that got further);
//             replica → worker  a Request on a connection the worker addressed as its server
//                             while the primary lives (a worker given the replica's address as
//                             its server's: it must not make the primary step down)
//
// Each message is its kind byte, then its fields through the shared little-endian codec
// (common/le_codec.hpp), written once in encode() and once in decode(). decode() checks the
// kind, every field's bytes and that none are left over, and throws Error(protocol) naming what
// is wrong; a peer's malformed message costs that peer its connection, never the process.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace gradlane::ps {

// replica: a replica joining a running server (ShardServer::join_server), id 0. aggregator:
// only in ListeningAt (an aggregator says hello as the worker it is at the server).
enum class PeerKind : std::uint8_t { worker = 1, primary = 2, replica = 3, aggregator = 4 };

// What a worker connected to a shard as: its server, or its replica (mirrors go there, and
// requests only once it failed over). A replica refuses a worker's requests on a connection
// addressed to it as the server while its primary lives.
enum class Addressed : std::uint8_t { server = 1, replica = 2 };

struct Hello {
  PeerKind kind = PeerKind::worker;
  std::uint32_t worker = 0;
  Addressed addressed = Addressed::server;
};
struct Request {
  std::uint32_t worker = 0;
  std::uint64_t tag = 0;
  std::uint64_t computed_on = 0;
};
struct Grant {
  std::uint64_t sequence = 0;
  std::uint64_t tag = 0;
  // ShardOptions::grant_windows: the rkey of a memory window bound on this connection over the
  // granted slot alone (write there, at the slot's address). 0: write through the ring's key.
  std::uint32_t window_rkey = 0;
  // Direct mode with grant windows: the grant's token (sidecar::grant_token of the server's
  // key), which the worker claims its slot at the replica with. 0: none.
  std::uint64_t token = 0;
};
struct Decided {
  std::uint64_t sequence = 0;
  std::uint32_t worker = 0;  // 0 = skipped
  std::uint64_t tag = 0;     // the worker's tag, so the replica's history names the update too
};
struct Ack {
  std::uint64_t through = 0;
};
struct Bye {
  std::uint32_t worker = 0;
};
struct FailedOver {
  std::uint32_t worker = 0;
};
struct Adopted {
  std::uint64_t version = 0;
};
struct ListeningAt {
  static constexpr std::size_t kAddressBytes = 46;  // INET6_ADDRSTRLEN: an IPv4 or IPv6 literal
  PeerKind kind = PeerKind::replica;                // replica or aggregator
  std::string address;
  std::uint16_t port = 0;
};
struct Mirroring {
  std::uint32_t worker = 0;
  std::uint64_t from = 0;
};
struct Forwarded {
  std::uint64_t member = 0;    // the worker's PushResult::sequence (direct) or ::aggregate (sidecar)
  std::uint64_t sequence = 0;  // the server's sequence for the sum (0 when not delivered)
  bool delivered = false;
};

struct Claim {
  std::uint64_t sequence = 0;
  std::uint64_t token = 0;  // sidecar::grant_token(the server's key, sequence)
};
// Server → its replica, after its hello (and to a replica that joined, after Adopted): the key
// its grants' tokens are made with (all zero: it binds no grant windows), so the replica can
// check the claims of workers mirroring to it — and, promoted, go on granting with it.
struct ReplicaKey {
  std::array<std::uint8_t, 16> key{};
};
// The answer to a Claim: the key that opens the claimed slot to this connection (a window; at a
// replica without windows, its ring's key), or 0: the sequence is decided already, write
// nothing. Its own kind, not a Grant: an answer left unread when its connection's peer was
// promoted (a mirror's claim, then a failover) must not pass for a grant there.
struct Opened {
  std::uint64_t sequence = 0;
  std::uint32_t window_rkey = 0;
};

struct AskLanded {
  std::uint32_t worker = 0;
};
struct Landed {
  std::uint64_t tag = 0;
  std::uint64_t sequence = 0;  // 0: no update of this worker landed (tag and computed_on 0)
  std::uint64_t computed_on = 0;
};

enum class RefusedWhy : std::uint8_t {
  version_from_future = 1,  // computed on a version ahead of every sequence granted here
  not_the_server = 2,       // a replica, whose primary lives, addressed as the worker's server
  round_closed = 3,         // ShardOptions::round: the round of the version it was computed on is full
};
inline constexpr bool is_known(RefusedWhy why) {
  return why >= RefusedWhy::version_from_future && why <= RefusedWhy::round_closed;  // the last one above
}
struct Refused {
  RefusedWhy why = RefusedWhy::version_from_future;
  std::uint64_t tag = 0;      // the request's
  std::uint64_t version = 0;  // the server's latest granted sequence when it refused
};

struct Pushing {
  std::uint64_t sequence = 0;
  std::uint64_t tag = 0;
  std::uint64_t computed_on = 0;
};

struct Dropped {
  std::uint32_t worker = 0;
};

using Message = std::variant<Hello, Request, Grant, Decided, Ack, Bye, FailedOver, Forwarded, Adopted, ListeningAt,
                             Mirroring, Claim, ReplicaKey, Opened, AskLanded, Landed, Refused, Pushing, Dropped>;

std::vector<std::byte> encode(const Message& message);
Message decode(std::span<const std::byte> bytes);

// ---- a worker's departure, as a shard server, a replica and an aggregator judge it ----
// A Bye on the connection of `worker`: sets said_bye, true. Another message: false. A Bye
// naming another worker is Error(protocol).
bool take_bye(const Message& message, std::uint32_t worker, bool& said_bye);
// A disconnect is a leave only after the worker's Bye and with nothing owed to it; otherwise
// the worker was lost — even owing nothing: its process or link died, or it failed over to the
// replica while this server lives, and whoever runs the job must know.
inline bool left_cleanly(bool said_bye, bool owes) noexcept { return said_bye && !owes; }
// What a lost worker's line adds when it owed nothing.
inline const char* lost_note(bool owes) noexcept { return owes ? "" : " (it went without saying it finished)"; }

}  // namespace gradlane::ps
