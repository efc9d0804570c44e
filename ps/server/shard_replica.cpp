// The replica's side of a ShardServer (shard_server.cpp): it applies what the server decided,
// tells the server when a worker fails over to it, and when the server dies it is promoted —
// in sidecar mode taking the server's sequence over at its own host's gradlaned.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "ps/protocol/join.hpp"
#include "ps/server/shard_state.hpp"

namespace gradlane::ps {
using shard::Clock;
using shard::Peer;

namespace {

// Reads `bytes` of `remote` (from remote_offset) into `local` (at local_offset) in pieces of at
// most 256 KiB, all posted before waiting: one 4 MiB READ over rxe took ~4 s (the responder's
// burst of 4,096 packets; a lost one restarts the READ). Each piece is waited for at most
// `patience`; a peer that stopped answering fails the QP first (the transport's give-up time).
void read_in_pieces(Connection& conn, const MemoryRegion& local, std::size_t local_offset,
                    const RegionDescriptor& remote, std::size_t remote_offset, std::size_t bytes, Millis patience) {
  constexpr std::size_t kReadPiece = std::size_t{256} << 10;
  std::vector<OpId> pieces;
  for (std::size_t at = 0; at < bytes; at += kReadPiece) {
    pieces.push_back(conn.read(local, local_offset + at, remote, remote_offset + at, std::min(kReadPiece, bytes - at)));
  }
  for (const OpId op : pieces) conn.wait(op, patience);
}

}  // namespace

// A worker asking us, the replica, for a slot while our primary lives cannot reach it: the
// primary must know, or it finishes the job as if that worker had left while we serve it (two
// final models, the link-flap fault). Once per worker.
void ShardServer::State::tell_primary_failed_over(Peer& worker) {
  if (worker.told_primary || !primary || !peers[*primary].alive) return;
  worker.told_primary = true;
  try {
    peers[*primary].conn.send(encode(FailedOver{worker.worker}));
  } catch (const Error& e) {
    lose(peers[*primary], e);
  }
}

// The server dropped `worker` (Dropped): so do we, before the skip that follows. Every
// connection of that id: the server knows one, and a restarted worker's new connection loses
// its mirroring here (it reads as a lost replica to it) rather than a late write landing.
void ShardServer::State::drop_as_the_server_did(std::uint32_t worker) {
  for (Peer& peer : peers) {
    if (peer.alive && peer.kind == PeerKind::worker && peer.worker == worker) {
      lose(peer, Error(Errc::timeout, fmt::format("the server dropped worker {}: it held a claimed sequence "
                                                  "unwritten past ten hole timeouts",
                                                  worker)));
    }
  }
}

// Taking a sequence over in sidecar mode: the sequences the old owner may have granted are
// skipped, in order, as they enter the window (ApplyOrder holds `slots` at a time); called until
// the window starts at skip_below (take_over_at_sidecar).
std::size_t ShardServer::State::skip_old_owners_sequences() {
  std::size_t skipped = 0;
  for (std::uint64_t s = order.next_sequence(); s < skip_below && s < order.next_sequence() + options.slots; ++s) {
    if (cancel(s) == Admit::accepted) ++skipped;
  }
  return skipped;
}

// Reaps the completion queue and takes every worker's messages and doorbells in it: at a
// promotion, or when the sidecar went away, what already came counts before anything later is
// refused. The messages first, as every round takes them: a sidecar-mode worker's Pushing says
// which of its pushes its doorbell brings (without it the update would be recorded as the
// worker's step 0 — a second one).
void ShardServer::State::take_every_doorbell_here() {
  while (cq.poll() > 0) {
  }
  for (std::size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i].alive || peers[i].kind != PeerKind::worker) continue;
    try {
      take_from(i);
    } catch (const Error&) {  // its failure is taken up on the next round
    }
  }
}

// A server whose gradlaned died (sidecar mode): the daemon restarted on this host holds our
// sequence (sidecar/daemon/survivors.hpp) until we attach taking it over, `slots` past where we
// are, exactly as a promoted replica does — what the dead daemon granted and has not arrived
// yet is skipped, and a late write of it is refused and reported lost to its worker, who reads
// refuse_below after each write. False if no gradlaned answers within the attach timeout.
bool ShardServer::State::take_own_sequence_over(const Error& lost) {
  std::fprintf(stderr, "gradlane ps server: %s — taking our sequence over at the next gradlaned on this host\n",
               lost.what());
  // Refuse everything until we know from where on, then take what is here (see promote()).
  shard.header().refuse_below.store(~std::uint64_t{0}, std::memory_order_seq_cst);
  take_every_doorbell_here();
  next_grant = order.next_sequence() + order.pending();
  sidecar.reset();
  try {
    take_over_at_sidecar();
  } catch (const Error& e) {
    std::fprintf(stderr, "gradlane ps server: could not take our sequence over: %s\n", e.what());
    return false;
  }
  ++stats.sidecars_resumed;
  return true;
}

// A promoted replica goes on `slots` past what it reached: every sequence the dead server may
// have granted lies below (it never granted past the replica's ack plus `slots`). Those are
// skipped as they enter the window, so a late write granted by the old owner rings for a
// sequence already skipped and is refused, never applied as another worker's update; the floor
// is published first, and a worker reads it after each write (its push then reports lost).
void ShardServer::State::fence_old_owners_sequences() {
  skip_below = next_grant + options.slots;
  shard.header().refuse_below.store(skip_below, std::memory_order_release);
  while (order.next_sequence() < skip_below && skip_old_owners_sequences() + apply() > 0) {
  }
  next_grant = skip_below;
}

// Replica promoted in sidecar mode: its host's gradlaned takes the server's sequence over,
// `slots` past what we reached (see ps.hpp). Attaching can fail (no gradlaned, not started
// with --standby): then nobody can grant our sequence, and the job must hear it, not hang.
void ShardServer::State::take_over_at_sidecar() {
  // The gradlaned grants from skip_below the moment we attach, and a worker on its host writes
  // at once: the old owner's sequences are skipped and what came applied before (a doorbell
  // of ours arriving while they are still ahead would be refused, its push acknowledged).
  fence_old_owners_sequences();
  sidecar::AttachOptions attach = *options.sidecar;
  attach.region_bytes = slots.slot_bytes() * options.slots;
  attach.take_over_at = skip_below - 1;
  attach.slots = options.slots;                              // grants never run past our slots (AttachOptions::slots)
  attach.grant_key = windowed() ? grant_key : std::nullopt;  // a promoted replica: its server's key
  sidecar.emplace(sidecar::Client::attach(attach));
  reported = 0;
  // Tags in sidecar mode count each worker's arrivals: go on from the history and from what
  // promote() handed to `order` (decided by the dead server, or acknowledged mirrors) and is
  // not applied yet.
  for (const AppliedUpdate& u : history) {
    if (!u.skipped) arrivals[u.worker] = std::max(arrivals[u.worker], u.tag + 1);
  }
  for (const auto& [sequence, d] : following.fed()) {
    if (d.worker != 0) arrivals[d.worker] = std::max(arrivals[d.worker], d.tag + 1);
  }
  std::fprintf(stderr, "gradlane ps server: gradlaned (%s) took over endpoint %u's sequence from %llu\n",
               attach.shm_name.c_str(), attach.endpoint, static_cast<unsigned long long>(skip_below));
}

// Replica whose server died: it becomes the server at the version it reached. A decided
// update whose mirror never came cannot be re-read from a dead server: skipped, counted lost.
// After the decided ones, the mirrors that arrived without a decision are applied too, in
// sequence order: their workers wrote them to us first and were told the push succeeded
// (acknowledged), and the dead server applied in sequence order, so this is the order it would
// have applied them in. A gap before one (a sequence granted and never written to us: its
// worker wrote nothing yet, or is writing now) is skipped; that late write is refused (see
// fence_old_owners_sequences). Their history entries name the worker whose doorbell brought
// them. Their tag: in sidecar mode the one the worker sent ahead of its mirror (Pushing); in
// direct mode, where only the dead server heard it (in the request), one past that worker's
// last decided tag: exact for workers that tag their pushes with consecutive steps, as every
// user here does (each worker has one push in flight, and direct mode drops none), and 0 for
// a worker with no decided update.
void ShardServer::State::promote() {
  const auto now = Clock::now();
  // Refuse everything until we know from where on, and say so first (a worker reads it after
  // each mirror). A write whose READ of it came before this store has its doorbell in our queue
  // already, and the reap below takes it.
  shard.header().refuse_below.store(~std::uint64_t{0}, std::memory_order_seq_cst);
  // Every mirror that is here counts. The failure was seen while input was being taken, so
  // doorbells of other workers may still wait, reaped or not (a worker acknowledged a push
  // whose mirror's doorbell was still in our queue, and it was skipped: kill:server@gradlane).
  take_every_doorbell_here();
  // Mirror claims are over: as the server we grant anew (and in sidecar mode claim anew).
  while (!claimed.empty()) close_claim(claimed.begin()->first);
  // The updates the dead server decided, and after them the mirrors it had not decided yet: a
  // worker's tag for those is one past its last decided tag, here or in our history.
  stats.lost_in_failover += following.take_over(order, [this](std::uint32_t worker) -> std::optional<std::uint64_t> {
    for (auto it = history.rbegin(); it != history.rend(); ++it) {
      if (!it->skipped && it->worker == worker) return it->tag;
    }
    return std::nullopt;
  });
  next_grant = order.next_sequence() + order.pending();
  primary.reset();
  role = Role::server;
  stats.promoted_at_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  std::fprintf(stderr, "gradlane ps replica: promoted to server at sequence %llu (the server is gone)\n",
               static_cast<unsigned long long>(next_grant));
  if (options.sidecar) {
    take_over_at_sidecar();
  } else {
    fence_old_owners_sequences();
  }
}

// A new replica joining a running server (ps.hpp, ShardServer::join_server).
void ShardServer::join_server(const std::string& address, std::uint16_t port, Millis timeout) {
  State& s = *state_;
  if (s.role != Role::replica || s.primary || s.late) {
    throw Error(Errc::invalid_argument, "join_server: a replica that has no server yet (instead of accept_peers)");
  }
  Connection conn = connect_with_retry(s.device, address, port, s.options.transport, timeout, s.cq);
  s.primary_slots = conn.wait_region(kSlotRegionId, timeout);
  conn.send(encode(Hello{PeerKind::replica, 0}));
  // The server adopts us between two applies, up to 64 of its rounds later; a server that
  // refuses (it has a replica, it is one) closes the connection and says why in its log.
  RegionDescriptor snapshot;
  Message answer;
  try {
    snapshot = conn.wait_region(kSnapshotRegionId, timeout);
    answer = decode(conn.receive(timeout));
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("the server at {}:{} did not take this replica (it has one, is one itself, or "
                                      "stepped down: its log says which): {}",
                                      address, port, e.what()));
  }
  const auto* adopted = std::get_if<Adopted>(&answer);
  if (adopted == nullptr) {
    throw Error(Errc::protocol, fmt::format("{}: expected the server to adopt this replica, got message kind {}",
                                            conn.describe(), answer.index() + 1));
  }
  const std::span<float> model = s.shard.floats();
  // With momentum the snapshot carries the server's velocity after the model: both configured
  // alike, or the replica would apply differently.
  const std::size_t expected = model.size_bytes() * (s.velocity.empty() ? 1 : 2);
  if (snapshot.length != expected) {
    throw Error(Errc::protocol,
                fmt::format("{}: the server's snapshot has {} bytes, this replica expects {} (its model{}): "
                            "the same shard, and momentum on both or neither?",
                            conn.describe(), snapshot.length, expected, s.velocity.empty() ? "" : " and velocity"));
  }
  // The model at the server's version, read straight into the shard (odd meanwhile: no reader
  // takes it); the velocity through a buffer of its own (once, on the control path).
  const Millis patience = std::max<Millis>(timeout, std::chrono::seconds(30));
  s.writer.begin_apply();
  read_in_pieces(conn, s.shard.register_floats_for_reads(s.device), 0, snapshot, 0, model.size_bytes(), patience);
  if (!s.velocity.empty()) {
    Buffer velocity = Buffer::allocate(model.size_bytes());
    const MemoryRegion into = MemoryRegion::register_buffer(s.device, velocity, Access::local_write);
    read_in_pieces(conn, into, 0, snapshot, model.size_bytes(), model.size_bytes(), patience);
    std::memcpy(s.velocity.data(), velocity.data(), model.size_bytes());
  }
  s.writer.restore(adopted->version);
  s.order = ApplyOrder(s.options.slots, adopted->version + 1);
  s.following.acknowledged(adopted->version);
  s.stats.joined_at = adopted->version;
  s.following.joined_running();
  conn.send(encode(Ack{adopted->version}));  // the server lets its snapshot go
  // Until a worker announces it mirrors here (Mirroring), its updates are read from the
  // server's slot, which the server keeps until we acknowledge it (ReplicaFollower::mirror_coming).
  s.options.read_updates_from_server = true;
  s.primary = s.peers.size();
  s.peers.push_back(Peer{std::move(conn), PeerKind::primary, 0, true, {}, {}, {}, false, false});
  s.start_admitting();
  // Now that workers can be admitted: where we listen, for the server to tell its workers.
  s.peers.back().conn.send(encode(ListeningAt{PeerKind::replica, s.listener.address(), s.listener.port()}));
  std::fprintf(stderr, "gradlane ps replica: joined the running server %s at version %llu\n",
               s.peers.back().conn.describe().c_str(), static_cast<unsigned long long>(adopted->version));
}

// Replica: turns the server's decision for the next sequence into an arrival or a cancel.
std::size_t ShardServer::State::decide_head() {
  // A mirror that has not come is given the hole timeout; then the update is read from the
  // server's slot, which the server keeps until we acknowledge it.
  return following.feed(order, Clock::now(), options.hole_timeout, !options.read_updates_from_server,
                        primary.has_value(), [this](std::uint64_t head) {
                          Connection& conn = peers[*primary].conn;
                          const std::uint64_t offset = (head % options.slots) * slots.slot_bytes();
                          // In pieces (a replica that reads slowly holds every slot); bounded by
                          // the transport's own give-up time, not hole_timeout.
                          read_in_pieces(conn, slots.region(), offset, primary_slots, offset, slots.slot_bytes(),
                                         std::max<Millis>(options.hole_timeout, std::chrono::seconds(30)));
                          ++stats.mirrors_fetched;
                        });
}

}  // namespace gradlane::ps
