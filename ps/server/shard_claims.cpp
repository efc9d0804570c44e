// A ShardServer's grant windows (shard_server.cpp): each granted slot opened by a memory window
// bound on the grantee's QP alone, the claims by which a sidecar-mode worker (or a mirroring one,
// at the replica) shows its grant's token to get that window, and closing them again.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>

#include "gradlane/ps/server.hpp"
#include "ps/receiving/apply_order.hpp"
#include "ps/protocol/join.hpp"
#include "ps/receiving/kernels.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/model_version.hpp"
#include "ps/receiving/outstanding_grants.hpp"
#include "ps/protocol/regions.hpp"
#include "ps/server/shard_state.hpp"

namespace gradlane::ps {
using shard::Clock;
using shard::Peer;
using shard::Waiting;

// Binds a window over the slot of `sequence` on the peer's connection; its key goes in the
// grant, sent after it on the same QP (RC executes the bind first).
std::uint32_t ShardServer::State::open_window(Peer& peer, std::uint64_t sequence) {
  MemoryWindow window = [&] {
    if (peer.spare_windows.empty()) return MemoryWindow::allocate(device);
    MemoryWindow spare = std::move(peer.spare_windows.back());
    peer.spare_windows.pop_back();
    return spare;
  }();
  peer.conn.bind_window(window, slots.window_region(static_cast<std::uint32_t>(sequence % options.slots)), 0,
                        slots.slot_bytes(), Access::remote_write);
  const std::uint32_t rkey = window.rkey();
  peer.windows.insert_or_assign(sequence, std::move(window));
  return rkey;
}

// Invalidates the window of `sequence`'s grant. A connection that has failed has revoked it
// already (the key died with the QP): nothing to do then, lose() says why.
void ShardServer::State::close_window(Peer& peer, std::uint64_t sequence) {
  auto it = peer.windows.find(sequence);
  if (it == peer.windows.end()) return;
  MemoryWindow window = std::move(it->second);
  peer.windows.erase(it);
  if (!window.bound()) return;
  try {
    peer.conn.invalidate_window(window);
  } catch (const Error&) {
    return;  // the connection failed: the window went with its QP
  }
  peer.spare_windows.push_back(std::move(window));
}

// Sidecar mode, grant windows: a worker shows the token its sidecar stamped on its grant of
// `claim.sequence`. The right token opens that slot to the worker's connection alone (a window
// bound on its QP, the key sent after the bind on the same QP), once. A wrong token is a rogue's
// guess or a forgery: the connection goes. A sequence decided already (cancelled, skipped as a
// stuck head or as the old owner's) gets window 0: nothing to write, the push is lost.
// Without windows a claim carries no token (a sidecar-mode aggregator's forward makes one): the
// answer is the ring's own key, and the sequence is held for the claimant — skip_stuck_head
// does not skip it while the claimant's connection lives — so its write, however late, cannot
// land in a slot a later sequence reuses.
void ShardServer::State::answer_claim(std::size_t index, const Claim& claim) {
  Peer& peer = peers[index];
  if (claim.sequence < skip_below) {  // the old owner's grant, claimed after we took over: refused
    peer.conn.send(encode(Opened{claim.sequence, 0}));
    return;
  }
  if (grant_key) {
    check_token(peer, claim, "sequence");
  } else if (claim.token != 0) {
    throw Error(Errc::protocol, fmt::format("worker {} claimed sequence {} with a token, but this server binds no "
                                            "grant windows (its grants carry no tokens)",
                                            peer.worker, claim.sequence));
  }
  const Admit admit = order.would_admit(claim.sequence, static_cast<std::uint32_t>(claim.sequence % options.slots));
  if (admit == Admit::already_done || admit == Admit::already_cancelled) {
    peer.conn.send(encode(Opened{claim.sequence, 0}));
    return;
  }
  if (admit != Admit::accepted || claimed.contains(claim.sequence)) {
    refuse_claim(peer, claim, "sequence", admit == Admit::accepted ? "claimed already" : admit_name(admit));
  }
  if (grant_key) return open_claim(index, claim.sequence);
  claimed[claim.sequence] = index;
  ++stats.claimed;
  peer.conn.send(encode(Opened{claim.sequence, slots.region().descriptor().rkey}));
}

// Replica: a worker about to mirror `claim.sequence` here shows its grant's token. With grant
// windows the right token opens that slot to the worker's connection, once, as a server's
// claim does (answer_claim); a sequence decided already gets window 0. Without windows the
// answer is the ring's own key: there is nothing to keep anyone out of.
void ShardServer::State::answer_mirror_claim(std::size_t index, const Claim& claim) {
  Peer& peer = peers[index];
  if (!options.grant_windows) {
    peer.conn.send(encode(Opened{claim.sequence, slots.region().descriptor().rkey}));
    return;
  }
  if (!grant_key) {
    throw Error(Errc::protocol, fmt::format("worker {} claimed mirror slot {}, but our server gave us no grant key: "
                                            "run server and replica both with grant_windows, or neither",
                                            peer.worker, claim.sequence));
  }
  check_token(peer, claim, "mirror slot");
  const std::uint64_t next = order.next_sequence();
  if (claim.sequence < next) {
    peer.conn.send(encode(Opened{claim.sequence, 0}));
    return;
  }
  if (claim.sequence - next >= options.slots || claimed.contains(claim.sequence) ||
      following.mirrored(claim.sequence)) {
    refuse_claim(peer, claim, "mirror slot",
                 claim.sequence - next >= options.slots ? "beyond the window" : "claimed or written already");
  }
  open_claim(index, claim.sequence);
}

// A claim's token against our key; a wrong one is a forgery (or a grant of another server).
void ShardServer::State::check_token(const Peer& peer, const Claim& claim, const char* what) {
  if (sidecar::grant_token(*grant_key, claim.sequence) == claim.token) return;
  refuse_claim(peer, claim, what,
               "its token is not the one its grant carried: a forged claim, or a grant of another server");
}

// Counts the refusal and throws it: the claimant's connection goes (take_input's lose()).
void ShardServer::State::refuse_claim(const Peer& peer, const Claim& claim, const char* what, std::string_view why) {
  ++stats.refused_claims;
  throw Error(Errc::protocol,
              fmt::format("worker {} claimed {} {}, refused: {}", peer.worker, what, claim.sequence, why));
}

// Opens `sequence`'s slot to the claimant at `index` (a window bound on its QP, the key sent
// after the bind on the same QP) until its doorbell, cancel, skip or apply (close_claim).
void ShardServer::State::open_claim(std::size_t index, std::uint64_t sequence) {
  Peer& peer = peers[index];
  const std::uint32_t window_rkey = open_window(peer, sequence);
  peer.conn.send(encode(Opened{sequence, window_rkey}));
  peer.outstanding.add(sequence, Clock::now());
  claimed[sequence] = index;
  ++stats.claimed;
}

// Whether a doorbell for `sequence` came from the connection that claimed its slot; without
// windows anyone's counts (the caller checks the window). The claim ends with it.
bool ShardServer::State::rung_by_claimant(Peer& peer, std::uint64_t sequence) {
  if (windowed() && !peer.outstanding.ring(sequence)) return false;
  close_claim(sequence);
  return true;
}

ReplicaKey ShardServer::State::replica_key() const { return ReplicaKey{grant_key.value_or(sidecar::GrantKey{})}; }

// Replica: our server's key (all zero: it binds no windows). A ring of ours that no key opens
// needs it, or no worker could mirror here.
void ShardServer::State::take_replica_key(const ReplicaKey& key) {
  if (key.key == sidecar::GrantKey{}) {
    grant_key.reset();
    if (options.grant_windows) {
      std::fprintf(stderr,
                   "gradlane ps replica: our server binds no grant windows, but our ring is windowed "
                   "(grant_windows): its workers cannot mirror here. Run server and replica both with grant_windows, "
                   "or neither\n");
    }
    return;
  }
  grant_key = key.key;
}

void ShardServer::State::close_claim(std::uint64_t sequence) {
  const auto it = claimed.find(sequence);
  if (it == claimed.end()) return;
  Peer& claimant = peers[it->second];
  claimed.erase(it);
  claimant.outstanding.forget(sequence);
  close_window(claimant, sequence);  // a late write is refused by the NIC, not landed in a reused slot
}

Admit ShardServer::State::cancel(std::uint64_t sequence) {
  close_claim(sequence);
  return order.cancelled(sequence);
}

}  // namespace gradlane::ps
