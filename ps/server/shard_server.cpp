// ShardServer: the server and the replica of one model shard (protocol: include/gradlane/ps.hpp).
// This file: taking input, granting (direct mode), telling the replica, the loop. Applying is in
// shard_apply.cpp, grant windows and claims in shard_claims.cpp, the sidecar's side in
// shard_sidecar.cpp; the replica's own side (following decisions, promotion) in
// shard_replica.cpp; accepting workers in shard_membership.cpp; the state they share in
// shard_state.hpp.
//
// Both keep the same two registered regions — the shard (ShardHeader + floats, read by pulls)
// and the ring of update slots (written by pushes) — and the same ApplyOrder. They differ in
// who decides: the server owns the sequence (grants it, applies arrivals in order, skips
// holes) and tells the replica each sequence's fate; the replica applies exactly that.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
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
namespace {
// A clock is 8 bytes per worker, and each applied update of the slowest scans them all.
constexpr std::uint32_t kMaxClockWorkers = 1U << 20;
}  // namespace
using shard::Clock;
using shard::Peer;
using shard::Waiting;

void ShardServer::State::lose(Peer& peer, const Error& why) {
  if (!peer.alive) return;
  // Doorbells reaped before the failure are writes the worker saw complete (acknowledged
  // there): taken before its sequences are written off. A worker that pushes its last update
  // and exits has its disconnect seen while the message loop throws, before its last doorbell
  // was taken (the 32-worker test: an acknowledged sequence skipped).
  try {
    while (cq.poll() > 0) {
    }
    take_doorbells(peer);
  } catch (const Error&) {  // none left: the failure itself
  }
  if (peer.kind == PeerKind::primary) {
    // Its last messages too — the decisions, and the Bye of a server that finished — which may
    // still wait in the queue when the failure is found elsewhere (an ack we sent after it
    // left: seen in CI, a finished server taken for a crash).
    while (cq.poll() > 0) {
    }
    try {
      take_from(static_cast<std::size_t>(&peer - peers.data()));
    } catch (const Error&) {  // the failure itself, once they are taken
    }
  }
  peer.alive = false;
  if (peer.kind == PeerKind::worker) {
    aggregators_at.erase(peer.worker);       // a dead aggregator's address
    following.mirrors_stopped(peer.worker);  // read its updates from the server's slot
  }
  // Whatever the reason, the peer is told: one written off here but alive there (its link was
  // down past our probe, a superseded connection) would otherwise wait out its own timeouts
  // for grants that never come — 120 s, seen in the link:2 fault.
  peer.conn.close();
  // Left or lost: messages.hpp (left_cleanly).
  const bool owes = !peer.outstanding.empty() || std::any_of(waiting.begin(), waiting.end(),
                                                             [&](const Waiting& w) { return &peers[w.peer] == &peer; });
  if (peer.kind == PeerKind::worker && left_cleanly(peer.said_bye, owes)) {
    ++stats.peers_left;
    return;
  }
  if (peer.kind == PeerKind::primary && peer.said_bye) {
    std::fprintf(stderr, "gradlane ps replica: the server finished and left: not promoted\n");
    return;
  }
  ++stats.peers_lost;
  if (peer.kind == PeerKind::worker) awaiting_rejoin[peer.worker] = Clock::now();
  std::fprintf(stderr, "gradlane ps %s: lost %s %u%s: %s\n", role == Role::server ? "server" : "replica",
               peer.kind == PeerKind::worker ? "worker" : "primary", peer.worker,
               peer.kind == PeerKind::worker ? lost_note(owes) : "", why.what());
  if (peer.kind == PeerKind::primary && role == Role::replica) promote();
  // Its granted (or, in sidecar mode, claimed) sequences will never be written: holes, skipped
  // in order. At a replica they are mirror claims: the server decides those, we follow.
  for (const std::uint64_t sequence : peer.outstanding.take_all()) {
    if (role == Role::replica) {
      close_claim(sequence);
    } else {
      cancel(sequence);
    }
  }
  // Sequences it held by claims without windows (answer_claim): its connection is closed, so
  // nothing of it lands any more.
  if (windowed()) return;
  std::vector<std::uint64_t> held;
  for (const auto& [sequence, claimant] : claimed) {
    if (&peers[claimant] == &peer) held.push_back(sequence);
  }
  for (const std::uint64_t sequence : held) cancel(sequence);
}

std::size_t ShardServer::State::take_from(std::size_t index) {
  Peer& peer = peers[index];
  std::size_t work = 0;
  while (auto bytes = peer.conn.try_receive()) {
    ++work;
    const Message message = decode(*bytes);
    // A replica queues requests too: a worker that saw the server die before we did fails over
    // and asks us; it is granted once we are promoted.
    if (const auto* request = std::get_if<Request>(&message); request && !sidecar) {
      if (peer.kind != PeerKind::worker || request->worker != peer.worker) {
        throw Error(Errc::protocol, fmt::format("request names worker {} on the connection of worker {}",
                                                request->worker, peer.worker));
      }
      if (role == Role::replica && peer.addressed == Addressed::server) {
        // Not a failover: the worker was given our address as its server's. Refused to it
        // alone; the primary goes on.
        peer.conn.send(encode(Refused{RefusedWhy::not_the_server, request->tag, 0}));
        ++stats.refused_requests;
        continue;
      }
      peer.outstanding.asked_again();
      waiting.push_back({index, *request});
      if (role == Role::replica) tell_primary_failed_over(peer);
    } else if (const auto* decided = std::get_if<Decided>(&message);
               decided && role == Role::replica && peer.kind == PeerKind::primary) {
      following.decided(*decided);
    } else if (const auto* mirroring = std::get_if<Mirroring>(&message); mirroring && peer.kind == PeerKind::worker) {
      // In any role: a replica promoted just before the worker's first mirror went out takes it
      // too (it no longer needs it).
      if (mirroring->worker != peer.worker) {
        throw Error(Errc::protocol, fmt::format("mirroring names worker {} on the connection of worker {}",
                                                mirroring->worker, peer.worker));
      }
      following.mirrors_from(peer.worker, mirroring->from);
    } else if (const auto* claim = std::get_if<Claim>(&message); claim && peer.kind == PeerKind::worker) {
      if (role == Role::replica) {
        answer_mirror_claim(index, *claim);
      } else if (sidecar) {
        answer_claim(index, *claim);
      } else {
        // Direct mode: a mirror's claim that reached us promoted (its worker claimed before the
        // old server died). Nothing to write: its push is lost, and the worker asks us again.
        peer.conn.send(encode(Opened{claim->sequence, 0}));
      }
    } else if (const auto* next = std::get_if<Pushing>(&message);
               next && peer.kind == PeerKind::worker && (options.sidecar || role == Role::replica)) {
      // Its doorbell follows on the same QP (a replica's: its mirror's, whose tag a promotion
      // needs; taken by a replica given no sidecar of its own too, which a sidecar-mode worker
      // mirrors to all the same). At most `slots` ahead of what we took: a worker saying more is
      // wrong, and loses only its own history's tags. Taken while no sidecar is attached too — a
      // replica not promoted yet, a server between gradlaneds — where dropping the worker would
      // lose it for a message.
      if (peer.pushing.size() >= options.slots) peer.pushing.erase(peer.pushing.begin());
      peer.pushing[next->sequence] = *next;
    } else if (const auto* ask = std::get_if<AskLanded>(&message); ask && peer.kind == PeerKind::worker) {
      if (ask->worker != peer.worker) {
        throw Error(Errc::protocol,
                    fmt::format("ask-landed names worker {} on the connection of worker {}", ask->worker, peer.worker));
      }
      // Its doorbells first: one that came before the ask (RC order) waits in the connection's
      // doorbell queue, taken after the messages — answered before it, the ask missed the push
      // it was sent behind (the test caught it: told 13 after pushing 14).
      work += take_doorbells(peer);
      const auto it = landed.find(peer.worker);
      peer.conn.send(encode(it == landed.end() ? Landed{} : it->second));
    } else if (const auto* key = std::get_if<ReplicaKey>(&message);
               key && role == Role::replica && peer.kind == PeerKind::primary) {
      take_replica_key(*key);
    } else if (const auto* at = std::get_if<ListeningAt>(&message);
               at && at->kind == PeerKind::aggregator && peer.kind == PeerKind::worker) {
      // An aggregator (a worker here) says where it listens: its workers that lost it come
      // back (a restarted aggregator). Said at every aggregator's start; passed on only for
      // one that joined late (restarted): the workers of the first are connected to it, and a
      // worker that joins later is told.
      if (role == Role::server) {
        aggregators_at[peer.worker] = *at;
        if (peer.joined_late) tell_workers(*at, peer.worker);
      }
    } else if (const auto* dropped = std::get_if<Dropped>(&message);
               dropped && role == Role::replica && peer.kind == PeerKind::primary) {
      drop_as_the_server_did(dropped->worker);
    } else if (const auto* ack = std::get_if<Ack>(&message);
               ack && role == Role::server && peer.kind == PeerKind::primary) {
      stats.replica_acked = std::max(stats.replica_acked, ack->through);
    } else if ((peer.kind == PeerKind::worker || (peer.kind == PeerKind::primary && role == Role::replica)) &&
               take_bye(message, peer.worker, peer.said_bye)) {
      // noted: its disconnect will be a leave (a server's: the job is over, nothing to take over)
    } else {
      throw Error(Errc::protocol, fmt::format("unexpected message (kind {}) at a {}", message.index() + 1,
                                              role == Role::server ? "server" : "replica"));
    }
  }
  return work + take_doorbells(peer);
}

std::size_t ShardServer::State::take_doorbells(Peer& peer) {
  std::size_t work = 0;
  // Sidecar mode, only those reaped already: a worker's Pushing, sent ahead of its doorbell (or
  // its mirror's), has then been taken with the messages before (a poll here could reap both,
  // the doorbell first).
  const bool reaped_only = options.sidecar.has_value();
  while (auto bell = reaped_only ? peer.conn.take_reaped_doorbell() : peer.conn.try_doorbell()) {
    ++work;
    const std::uint64_t sequence = ApplyOrder::widen(bell->imm, order.next_sequence());
    if (role == Role::replica) {
      // The mirror: held until the server says what it did with this sequence. With windows,
      // only from the worker that claimed its slot here.
      const bool claimant = rung_by_claimant(peer, sequence);
      if (claimant && sequence >= order.next_sequence() && sequence < order.next_sequence() + options.slots) {
        const auto said = peer.pushing.extract(sequence);
        following.mirror_rang(sequence, peer.worker,
                              said.empty() ? std::nullopt : std::optional<std::uint64_t>(said.mapped().tag));
        peer.pushing.erase(peer.pushing.begin(), peer.pushing.lower_bound(sequence));  // never rung
      } else {
        ++stats.refused_doorbells;
      }
      continue;
    }
    if (sidecar) {
      // The sidecar granted it. Without grant windows we cannot tell to whom, only that it is
      // in the window, once; with them, only the connection that claimed it may ring. Below
      // skip_below it was granted by the old owner before we took over: refused.
      const bool claimant = rung_by_claimant(peer, sequence);
      if (claimant && sequence >= skip_below &&
          order.arrived(sequence, static_cast<std::uint32_t>(sequence % options.slots)) == Admit::accepted) {
        doorbell_ns[sequence % options.slots] = monotonic_ns();
        rung_by[sequence] = peer.worker;
        if (const auto said = peer.pushing.extract(sequence); !said.empty()) {
          pushed[sequence] = said.mapped();
          note_landed(peer.worker, Landed{said.mapped().tag, sequence, said.mapped().computed_on});
        }
        peer.pushing.erase(peer.pushing.begin(), peer.pushing.lower_bound(sequence));  // never rung
      } else {
        ++stats.refused_doorbells;
      }
      continue;
    }
    // Server: only the worker it was granted to may ring for a sequence, once.
    if (!peer.outstanding.ring(sequence) ||
        order.arrived(sequence, static_cast<std::uint32_t>(sequence % options.slots)) != Admit::accepted) {
      ++stats.refused_doorbells;
    } else {
      doorbell_ns[sequence % options.slots] = monotonic_ns();
      close_window(peer, sequence);  // the update is here: nothing more may land in its slot
      if (const auto g = granted.find(sequence); g != granted.end()) {
        note_landed(g->second.worker, Landed{g->second.tag, sequence, g->second.computed_on});
      }
    }
  }
  return work;
}

void ShardServer::State::note_landed(std::uint32_t worker, const Landed& update) {
  if (worker == 0) return;
  Landed& last = landed[worker];
  if (update.sequence > last.sequence) last = update;
}

std::size_t ShardServer::State::take_input() {
  // One poll reaps every connection's arrivals into its connection; then only the connections
  // that got something (or failed) are visited.
  std::size_t work = static_cast<std::size_t>(cq.poll());
  for (std::size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i].alive || !peers[i].conn.has_pending_input()) continue;
    try {
      work += take_from(i);
    } catch (const Error& e) {
      lose(peers[i], e);
      ++work;
    }
  }
  if (replica && replica->has_pending_input()) {
    try {
      while (auto bytes = replica->try_receive()) {
        ++work;
        const Message message = decode(*bytes);
        if (const auto* moved = std::get_if<FailedOver>(&message)) {
          if (!stats.stepped_down) {
            std::fprintf(stderr,
                         "gradlane ps server: worker %u asked the replica for a slot while this server lives "
                         "(its link to us failed): stepping down — no more grants, what was granted is finished, "
                         "then the replica serves the whole job\n",
                         moved->worker);
          }
          stats.stepped_down = true;
          continue;
        }
        if (const auto* at = std::get_if<ListeningAt>(&message); at && at->kind == PeerKind::replica) {
          replica_at = *at;  // a replica that joined: where it listens
          tell_workers(*at);
          continue;
        }
        const auto* ack = std::get_if<Ack>(&message);
        if (ack == nullptr) throw Error(Errc::protocol, "the replica sent something other than an ack or a failover");
        stats.replica_acked = std::max(stats.replica_acked, ack->through);
        snapshot.reset();  // a joined replica acknowledges once it has read it
      }
    } catch (const Error& e) {
      lose_replica(e);
    }
  }
  return work;
}

std::size_t ShardServer::State::grant() {
  if (stats.stepped_down) return 0;  // the replica grants from now on
  std::size_t work = 0;
  const HeldSlots held(peers, options.slots);
  while (!waiting.empty() && !held.all()) {
    const std::uint64_t sequence = next_grant;
    // Slot `sequence % slots` is free once the update that last used it (sequence - slots) was
    // applied here and, with a replica, acknowledged by it.
    if (sequence >= order.next_sequence() + options.slots) break;
    if (replica && sequence > stats.replica_acked + options.slots) break;
    if (held.holds(sequence)) {  // granted to nobody, skipped
      cancel(sequence);
      ++next_grant;
      ++work;
      continue;
    }
    const Waiting w = waiting.front();
    waiting.pop_front();
    Peer& peer = peers[w.peer];
    if (!peer.alive) continue;
    // Refused before anything is written and without consuming the sequence: computed on a
    // model no sequence here has reached yet (as the sidecar refuses it), or, with rounds, its
    // round already took its `round` updates (as a backup worker's is dropped).
    std::optional<RefusedWhy> refusal;
    if (w.request.computed_on >= sequence) {
      refusal = RefusedWhy::version_from_future;
    } else if (options.round != 0 && (sequence - 1) / options.round != w.request.computed_on / options.round) {
      refusal = RefusedWhy::round_closed;
    }
    if (refusal) {
      try {
        peer.conn.send(encode(Refused{*refusal, w.request.tag, sequence - 1}));
        ++(*refusal == RefusedWhy::round_closed ? stats.refused_rounds : stats.refused_requests);
      } catch (const Error& e) {
        lose(peer, e);
      }
      ++work;
      continue;
    }
    try {
      const std::uint32_t window_rkey = options.grant_windows ? open_window(peer, sequence) : 0;
      // The token: the worker claims its mirror's slot at the replica with it.
      const std::uint64_t token = grant_key ? sidecar::grant_token(*grant_key, sequence) : 0;
      peer.conn.send(encode(Grant{sequence, w.request.tag, window_rkey, token}));  // after the bind on the same QP
    } catch (const Error& e) {
      lose(peer, e);
      continue;
    }
    peer.outstanding.add(sequence, Clock::now());
    granted[sequence] = {peer.worker, w.request.tag, w.request.computed_on};
    ++next_grant;
    ++stats.granted;
    ++work;
  }
  return work;
}

std::size_t ShardServer::State::expire_holes() {
  return ps::expire_holes(
      peers, options.hole_timeout, [&] { return take_input(); },
      [&](Peer& peer, std::uint64_t sequence) {
        std::fprintf(stderr,
                     "gradlane ps server: worker %u granted sequence %llu and wrote nothing in %lld ms: skipped%s\n",
                     peer.worker, static_cast<unsigned long long>(sequence),
                     static_cast<long long>(options.hole_timeout.count()),
                     options.grant_windows ? ""
                                           : "; its slot is not reused until the worker asks again (no grant "
                                             "windows: its write may still land there)");
        order.cancelled(sequence);
        if (options.grant_windows) {
          close_window(peer, sequence);  // a late write is refused by the NIC
        } else {
          peer.outstanding.may_still_land(sequence);  // its slot rests until the worker asks again
        }
      });
}

void ShardServer::State::tell_replica(const AppliedUpdate& record) {
  send_to_replica(Decided{record.sequence, record.skipped ? 0 : std::max<std::uint32_t>(record.worker, 1), record.tag});
}

void ShardServer::State::send_to_replica(const Message& message) {
  if (!replica) return;
  try {
    replica->send(encode(message));
  } catch (const Error& e) {
    lose_replica(e);
  }
}

void ShardServer::State::lose_replica(const Error& why) {
  std::fprintf(stderr,
               "gradlane ps server: lost the replica: %s; serving without it (a new one may join: "
               "ShardServer::join_server)\n",
               why.what());
  ++stats.peers_lost;
  replica.reset();
  stats.has_replica = false;
  snapshot.reset();
  replica_at.reset();
}

void ShardServer::State::tell_workers(const ListeningAt& at, std::uint32_t except, Peer* only) {
  for (Peer& peer : peers) {
    if (!peer.alive || peer.kind != PeerKind::worker || peer.worker == except || (only != nullptr && &peer != only)) {
      continue;
    }
    try {
      peer.conn.send(encode(at));
    } catch (const Error& e) {
      lose(peer, e);
    }
  }
}

ShardServer::ShardServer(const Device& device, Role role, std::uint16_t port, const ShardOptions& options,
                         std::span<const float> initial) {
  if (options.floats == 0 || options.slots == 0) {
    throw Error(Errc::invalid_argument, "ShardServer: the shard needs floats > 0 and slots > 0");
  }
  if (options.round != 0 && options.sidecar) {
    throw Error(Errc::invalid_argument,
                "ShardServer: ShardOptions::round is direct mode's; in sidecar mode the staleness bound is "
                "gradlaned's tau (--staleness-bound)");
  }
  if (options.clock_workers > kMaxClockWorkers) {
    throw Error(Errc::invalid_argument, fmt::format("ShardServer: clock_workers {} is above the {} workers a shard "
                                                    "keeps clocks for",
                                                    options.clock_workers, kMaxClockWorkers));
  }
  if (initial.size() != options.floats) {
    throw Error(Errc::invalid_argument,
                fmt::format("ShardServer: initial model has {} floats, the shard {}", initial.size(), options.floats));
  }
  state_ = std::make_unique<State>(device, role, port, options);
  // Grant windows: a server's key for its grants' tokens (a replica learns its server's).
  if (options.grant_windows && role == Role::server) state_->grant_key = sidecar::random_grant_key();
  std::copy(initial.begin(), initial.end(), state_->shard.floats().begin());
  // Published again: with the initial model's checksum.
  state_->writer.restore(0);
  state_->shard.header().tensor = options.tensor;
  if (options.sidecar && role == Role::server) {  // a replica attaches when promoted
    sidecar::AttachOptions attach = *options.sidecar;
    attach.region_bytes = state_->slots.slot_bytes() * options.slots;
    attach.slots = options.slots;          // grants never run past our slots (AttachOptions::slots)
    attach.grant_key = state_->grant_key;  // its grants carry our tokens (grant windows)
    state_->sidecar.emplace(sidecar::Client::attach(attach));
  }
  if (options.momentum > 0.0F) state_->velocity.assign(options.floats, 0.0F);
  state_->doorbell_ns.assign(options.slots, 0);
}

ShardServer::ShardServer(ShardServer&&) noexcept = default;
ShardServer& ShardServer::operator=(ShardServer&&) noexcept = default;
ShardServer::~ShardServer() {
  // A server that goes away cleanly first hands its replica every decision it made (bounded):
  // otherwise the replica, promoted by the disconnect, loses the last ones (a replica could end
  // at version 19 of 20).
  if (!state_ || state_->sidecar_lost) return;
  try {
    drain_replica(std::chrono::seconds(5));
    // And says it is done, so the replica does not take the disconnect for a crash and promote
    // itself (in sidecar mode that moves the sequence: a takeover at the end of every job). A
    // server that stepped down says nothing: there the replica is to take over.
    State& s = *state_;
    if (s.role == Role::server && s.replica && !s.stats.stepped_down) {
      s.replica->send(encode(Bye{0}));
      s.replica->flush(std::chrono::seconds(1));
    }
  } catch (...) {  // a destructor must not throw; the replica's own failover takes over
  }
}

bool ShardServer::drain_replica(Millis timeout) {
  const State& s = *state_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (s.role == Role::server && s.replica && s.stats.replica_acked < s.stats.applied + s.stats.skipped) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    progress();
  }
  return true;
}

std::uint16_t ShardServer::port() const { return state_->listener.port(); }

void ShardServer::connect_replica(const std::string& address, std::uint16_t port, Millis timeout) {
  State& s = *state_;
  if (s.role != Role::server) throw Error(Errc::invalid_argument, "connect_replica: only a server has a replica");
  Connection conn = connect_with_retry(s.device, address, port, s.options.transport, timeout, s.cq);
  conn.advertise(kSlotRegionId, s.slots.region().descriptor());
  conn.send(encode(Hello{PeerKind::primary, 0}));
  conn.send(encode(s.replica_key()));
  s.replica.emplace(std::move(conn));
  s.had_replica = s.stats.has_replica = true;
}

std::size_t ShardServer::progress() {
  State& s = *state_;
  ++s.rounds;
  std::size_t work = s.take_input();
  s.probe_idle_peers();
  work += s.admit_joiners();
  if (s.role == Role::server && s.sidecar) {
    try {
      work += s.take_sidecar();
      work += s.skip_stuck_head();
      work += s.apply();
      s.report_applied();
    } catch (const Error& e) {
      if (e.code() != Errc::sidecar_unavailable) throw;
      // Our gradlaned is gone. One restarted on this host holds our sequence until we take it
      // on from where we are; with none within the attach timeout we stop, and the replica
      // takes over as after a crash.
      if (!s.take_own_sequence_over(e)) {
        s.sidecar_lost = true;
        throw;
      }
      ++work;
    }
  } else if (s.role == Role::server) {
    work += s.expire_holes();
    // Grant before applying too: a free slot needs no apply, and the worker's write then runs
    // while the server applies the previous update (measured: the grant waited a whole apply).
    work += s.grant();
    work += s.apply();
    work += s.grant();
  } else {
    work += s.decide_head();
    work += s.apply();
  }
  return work;
}

bool ShardServer::wait_for_input(Millis timeout) { return state_->cq.wait(timeout); }

bool ShardServer::run_until(std::uint64_t sequence, Millis timeout) {
  // Longest sleep while idle: the server's own timers (hole_timeout, the sidecar's cancels,
  // which come through shared memory, not the completion channel) still run this often.
  constexpr Millis kIdleSleep{20};
  const auto deadline = Clock::now() + timeout;
  std::uint32_t idle = 0;
  while (state_->stats.applied + state_->stats.skipped < sequence && !finished()) {
    if (progress() != 0) continue;
    // Read the clock only every so many idle rounds (a read costs ~1 µs under some VMs).
    if (++idle % 64 != 0) continue;
    const auto now = Clock::now();
    if (now > deadline) return false;
    if (state_->options.block_when_idle) {
      wait_for_input(std::min(kIdleSleep, std::chrono::duration_cast<Millis>(deadline - now) + Millis(1)));
    }
  }
  return true;
}

bool ShardServer::finished() const {
  const State& s = *state_;
  // A lost worker may rejoin within the grace (ShardOptions::rejoin_grace).
  if (s.role == Role::server) {
    const auto now = Clock::now();
    for (const auto& [worker, lost_at] : s.awaiting_rejoin) {
      if (now - lost_at < s.options.rejoin_grace) return false;
    }
  }
  if (s.role == Role::server && s.sidecar) return live_workers() == 0 && s.order.pending() == 0;
  if (s.role == Role::server && s.stats.stepped_down) return s.granted.empty() && s.order.pending() == 0;
  if (s.role == Role::server) {
    return live_workers() == 0 && s.waiting.empty() && s.granted.empty() && s.order.pending() == 0;
  }
  return (!s.primary || !s.peers[*s.primary].alive) && s.following.all_fed() && !s.order.next();
}

bool ShardServer::cut_off() const {
  const State& s = *state_;
  // Not `!s.replica`: the replica's connection, idle once the workers are gone, may not be seen
  // to fail before the server finishes; a server that then exits as finished while its replica,
  // promoted, goes on leaves two final models.
  if (s.role != Role::server || !s.had_replica) return false;
  bool any_worker = false;
  for (const Peer& peer : s.peers) {
    if (peer.kind != PeerKind::worker) continue;
    if (peer.alive || peer.said_bye) return false;
    any_worker = true;
  }
  return any_worker;
}

std::uint64_t ShardServer::version() const { return state_->writer.model_version(); }
std::size_t ShardServer::waiting_behind_hole() const { return state_->order.next() ? 0 : state_->order.pending(); }
std::span<const float> ShardServer::model() const { return state_->shard.floats(); }
const ServerStats& ShardServer::stats() const { return state_->stats; }
const std::vector<AppliedUpdate>& ShardServer::history() const { return state_->history; }
std::size_t ShardServer::live_workers() const {
  std::size_t n = 0;
  for (const Peer& p : state_->peers) n += p.alive && p.kind == PeerKind::worker;
  return n;
}

}  // namespace gradlane::ps
