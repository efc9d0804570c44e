// ShardServer: the server and the replica of one model shard (protocol: include/gradlane/ps.hpp).
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
#include <map>
#include <memory>

#include "gradlane/ps.hpp"
#include "transport/ps/apply_order.hpp"
#include "transport/ps/join.hpp"
#include "transport/ps/kernels.hpp"
#include "transport/ps/messages.hpp"
#include "transport/ps/model_version.hpp"
#include "transport/ps/outstanding_grants.hpp"
#include "transport/ps/regions.hpp"

namespace gradlane::ps {
namespace {

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
  bool said_bye = false;  // the worker (or, at a replica, the server) said it finished: a leave
  bool told_primary = false;  // replica: the primary heard this worker failed over to us
};

// A connection accepted after accept_peers, advertised to, waiting for its hello.
struct Joining {
  Connection conn;
  Clock::time_point deadline;
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

}  // namespace

struct ShardServer::State {
  State(const Device& dev, Role r, std::uint16_t port, const ShardOptions& o)
      : role(r),
        options(o),
        device(dev),
        shard(dev, o.floats),
        slots(dev, o.floats, o.slots, o.grant_windows && r == Role::server),
        writer(shard.header()),
        order(o.slots, 1),
        cq(dev, 1024, o.shared_receives, o.transport.max_message_bytes),
        listener(dev, port, o.transport) {
    // One completion queue for every connection (workers, primary, replica): a round polls it
    // once instead of once per connection, and an idle server can sleep on it (wait()).
    listener.use_completion_queue(cq);
    if (o.grant_windows && r == Role::server) {
      if (o.sidecar) {
        throw Error(Errc::invalid_argument,
                    "grant_windows needs direct mode: with a sidecar, the sidecar grants and the server cannot bind "
                    "a window for a worker it does not know");
      }
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
  ShardWriter writer;
  ApplyOrder order;
  CompletionQueue cq;
  Listener listener;
  std::vector<Peer> peers;
  bool admitting = false;         // accept_peers done: later workers join from progress()
  std::vector<Joining> joining;   // accepted late, hello not yet here
  ServerStats stats;
  std::vector<AppliedUpdate> history;

  // ---- server ----
  std::optional<Connection> replica;
  // Sidecar mode: the sidecar owns the sequence; we take its cancels and report progress.
  std::optional<sidecar::Client> sidecar;
  std::uint64_t reported = 0;                       // last `through` sent with Client::applied
  std::map<std::uint64_t, std::uint32_t> rung_by;   // sequence -> worker whose doorbell brought it
  std::map<std::uint32_t, std::uint64_t> arrivals;  // worker -> updates arrived from it
  std::optional<Clock::time_point> gap_since;       // head missing while later updates wait
  // Promoted in sidecar mode: sequences below this were the old owner's to grant (skipped).
  std::uint64_t skip_below = 0;
  // Direct mode: this server owns the sequence.
  std::deque<Waiting> waiting;
  std::uint64_t next_grant = 1;
  std::map<std::uint64_t, GrantInfo> granted;  // granted, not yet applied or skipped

  // ---- replica ----
  std::optional<std::size_t> primary;        // index in peers
  RegionDescriptor primary_slots;            // the server's ring: where a lost mirror is re-read
  std::map<std::uint64_t, Decided> decisions;  // sequence -> what the server did (worker 0 = skip)
  std::map<std::uint64_t, Decided> fed;        // decisions handed to `order`, until applied
  std::map<std::uint64_t, std::uint32_t> arrived;  // doorbells seen: sequence -> the worker that rang
  std::optional<Clock::time_point> head_waiting_since;  // head decided "apply", data not here
  std::uint64_t acked = 0;

  void lose(Peer& peer, const Error& why);
  void tell_primary_failed_over(Peer& worker);
  std::uint32_t open_window(Peer& peer, std::uint64_t sequence);
  void close_window(Peer& peer, std::uint64_t sequence);
  std::size_t take_doorbells(Peer& peer);
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
  void take_over_at_sidecar();
  void probe_idle_workers();
  void advertise(Connection& conn);
  std::size_t admit_joiners();
  void admit(Connection conn, const Hello& hello);
  std::uint32_t rounds = 0;                 // progress() calls, to read the clock only so often
  Clock::time_point last_probe{};
  void report_applied();
  void tell_replica(const AppliedUpdate& record);
  void apply_update(std::uint32_t slot);
  // Between chunks of an apply: what must not wait for a whole apply.
  void between_chunks();
};

void ShardServer::State::lose(Peer& peer, const Error& why) {
  if (!peer.alive) return;
  // Doorbells reaped before the failure are writes the worker saw complete (acknowledged
  // there): taken before its sequences are written off. A worker that pushes its last update
  // and exits has its disconnect seen while the message loop throws, before its last doorbell
  // was taken (the 32-worker test: an acknowledged sequence skipped).
  try {
    take_doorbells(peer);
  } catch (const Error&) {  // none left: the failure itself
  }
  peer.alive = false;
  // Whatever the reason, the peer is told: one written off here but alive there (its link was
  // down past our probe, a superseded connection) would otherwise wait out its own timeouts
  // for grants that never come — 120 s, seen in the link:2 fault.
  peer.conn.close();
  // Left or lost: messages.hpp (left_cleanly).
  const bool owes = !peer.outstanding.empty() ||
                    std::any_of(waiting.begin(), waiting.end(), [&](const Waiting& w) { return &peers[w.peer] == &peer; });
  if (peer.kind == PeerKind::worker && left_cleanly(peer.said_bye, owes)) {
    ++stats.peers_left;
    return;
  }
  if (peer.kind == PeerKind::primary && peer.said_bye) {
    std::fprintf(stderr, "gradlane ps replica: the server finished and left: not promoted\n");
    return;
  }
  ++stats.peers_lost;
  std::fprintf(stderr, "gradlane ps %s: lost %s %u%s: %s\n", role == Role::server ? "server" : "replica",
               peer.kind == PeerKind::worker ? "worker" : "primary", peer.worker,
               peer.kind == PeerKind::worker ? lost_note(owes) : "", why.what());
  if (peer.kind == PeerKind::primary && role == Role::replica) promote();
  // Its granted sequences will never be written: holes, skipped in order.
  for (const std::uint64_t sequence : peer.outstanding.take_all()) order.cancelled(sequence);
}

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
      waiting.push_back({index, *request});
      if (role == Role::replica) tell_primary_failed_over(peer);
    } else if (const auto* decided = std::get_if<Decided>(&message); decided && role == Role::replica &&
                                                                       peer.kind == PeerKind::primary) {
      decisions[decided->sequence] = *decided;
    } else if (const auto* ack = std::get_if<Ack>(&message); ack && role == Role::server && peer.kind == PeerKind::primary) {
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
  while (auto bell = peer.conn.try_doorbell()) {
    ++work;
    const std::uint64_t sequence = ApplyOrder::widen(bell->imm, order.next_sequence());
    if (role == Role::replica) {
      // The mirror: held until the server says what it did with this sequence.
      if (sequence >= order.next_sequence() && sequence < order.next_sequence() + options.slots) {
        arrived[sequence] = peer.worker;
      } else {
        ++stats.refused_doorbells;
      }
      continue;
    }
    if (sidecar) {
      // The sidecar granted it; we cannot tell to whom, only that it is in the window, once.
      // Below skip_below it was granted by the old owner before we took over: refused.
      if (sequence >= skip_below && order.arrived(sequence, static_cast<std::uint32_t>(sequence % options.slots)) == Admit::accepted) {
        rung_by[sequence] = peer.worker;
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
      close_window(peer, sequence);  // the update is here: nothing more may land in its slot
    }
  }
  return work;
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
            std::fprintf(stderr, "gradlane ps server: worker %u asked the replica for a slot while this server lives "
                         "(its link to us failed): stepping down — no more grants, what was granted is finished, "
                         "then the replica serves the whole job\n", moved->worker);
          }
          stats.stepped_down = true;
          continue;
        }
        const auto* ack = std::get_if<Ack>(&message);
        if (ack == nullptr) throw Error(Errc::protocol, "the replica sent something other than an ack or a failover");
        stats.replica_acked = std::max(stats.replica_acked, ack->through);
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "gradlane ps server: lost the replica: %s; serving without it\n", e.what());
      ++stats.peers_lost;
      replica.reset();
    }
  }
  return work;
}

std::size_t ShardServer::State::grant() {
  if (stats.stepped_down) return 0;  // the replica grants from now on
  std::size_t work = 0;
  while (!waiting.empty()) {
    const std::uint64_t sequence = next_grant;
    // Slot `sequence % slots` is free once the update that last used it (sequence - slots) was
    // applied here and, with a replica, acknowledged by it.
    if (sequence >= order.next_sequence() + options.slots) break;
    if (replica && sequence > stats.replica_acked + options.slots) break;
    const Waiting w = waiting.front();
    waiting.pop_front();
    Peer& peer = peers[w.peer];
    if (!peer.alive) continue;
    try {
      const std::uint32_t window_rkey = options.grant_windows ? open_window(peer, sequence) : 0;
      peer.conn.send(encode(Grant{sequence, w.request.tag, window_rkey}));  // after the bind on the same QP
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
  std::size_t work = 0;
  bool any = false;
  for (const Peer& p : peers) any = any || !p.outstanding.empty();
  if (!any) return 0;
  const auto now = Clock::now();
  if (std::none_of(peers.begin(), peers.end(), [&](const Peer& p) { return p.outstanding.any_expired(now, options.hole_timeout); })) {
    return 0;
  }
  // A process stopped or descheduled between its last look at the input and here wakes to find
  // every grant "expired", though the writes landed meanwhile (the NIC takes them while the
  // process sleeps): look again, after the clock was read, before calling anything a hole.
  work += take_input();
  for (Peer& peer : peers) {
    for (const std::uint64_t sequence : peer.outstanding.expire(now, options.hole_timeout)) {
      std::fprintf(stderr, "gradlane ps server: worker %u granted sequence %llu and wrote nothing in %lld ms: skipped\n",
                   peer.worker, static_cast<unsigned long long>(sequence), static_cast<long long>(options.hole_timeout.count()));
      order.cancelled(sequence);
      close_window(peer, sequence);  // a late write is refused by the NIC, not landed in a reused slot
      ++work;
    }
  }
  return work;
}

// Binds a window over the slot of `sequence` on the peer's connection; its key goes in the
// grant, sent after it on the same QP (RC executes the bind first).
std::uint32_t ShardServer::State::open_window(Peer& peer, std::uint64_t sequence) {
  MemoryWindow window = [&] {
    if (peer.spare_windows.empty()) return MemoryWindow::allocate(device);
    MemoryWindow spare = std::move(peer.spare_windows.back());
    peer.spare_windows.pop_back();
    return spare;
  }();
  peer.conn.bind_window(window, slots.slot_region(static_cast<std::uint32_t>(sequence % options.slots)), 0,
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

std::size_t ShardServer::State::take_sidecar() {
  std::size_t work = 0;
  while (auto g = sidecar->poll()) {
    ++work;
    if (g->kind == sidecar::GrantKind::cancel) {
      if (order.cancelled(g->sequence) != Admit::accepted) ++stats.refused_cancels;
    } else {
      std::fprintf(stderr, "gradlane ps server: the sidecar answered: %s (%s)\n",
                   std::string(sidecar::kind_name(g->kind)).c_str(), std::string(sidecar::reason_name(g->reason)).c_str());
    }
  }
  return work;
}

// Sidecar mode: a worker that took its grant and stalls without dying never gets cancelled by
// the sidecar. Sequences are granted in order, so once a later one has arrived the head was
// granted too: give it hole_timeout, then skip it.
std::size_t ShardServer::State::skip_stuck_head() {
  if (order.next() || order.pending() == 0) {
    gap_since.reset();
    return 0;
  }
  const auto now = Clock::now();
  if (!gap_since) gap_since = now;
  if (now - *gap_since < options.hole_timeout) return 0;
  std::fprintf(stderr, "gradlane ps server: sequence %llu did not arrive in %lld ms while later ones did: skipped\n",
               static_cast<unsigned long long>(order.next_sequence()), static_cast<long long>(options.hole_timeout.count()));
  order.cancelled(order.next_sequence());
  gap_since.reset();
  return 1;
}

// Promoted in sidecar mode: the sequences the old owner may have granted are skipped, in order,
// as they enter the window (ApplyOrder holds `slots` at a time).
std::size_t ShardServer::State::skip_old_owners_sequences() {
  std::size_t skipped = 0;
  for (std::uint64_t s = order.next_sequence(); s < skip_below && s < order.next_sequence() + options.slots; ++s) {
    if (order.cancelled(s) == Admit::accepted) ++skipped;
  }
  return skipped;
}

// Replica promoted in sidecar mode: its host's gradlaned takes the server's sequence over,
// `slots` past what we reached (see ps.hpp). Attaching can fail (no gradlaned, not started
// with --standby): then nobody can grant our sequence, and the job must hear it, not hang.
void ShardServer::State::take_over_at_sidecar() {
  skip_below = next_grant + options.slots;
  shard.header().refuse_below.store(skip_below, std::memory_order_release);
  sidecar::AttachOptions attach = *options.sidecar;
  attach.region_bytes = slots.slot_bytes() * options.slots;
  attach.take_over_at = skip_below - 1;
  sidecar.emplace(sidecar::Client::attach(attach));
  reported = 0;
  // Tags in sidecar mode count each worker's arrivals: go on from the history and from what
  // promote() handed to `order` (decided by the dead server, or acknowledged mirrors) and is
  // not applied yet.
  for (const AppliedUpdate& u : history) {
    if (!u.skipped) arrivals[u.worker] = std::max(arrivals[u.worker], u.tag + 1);
  }
  for (const auto& [sequence, d] : fed) {
    if (d.worker != 0) arrivals[d.worker] = std::max(arrivals[d.worker], d.tag + 1);
  }
  std::fprintf(stderr, "gradlane ps replica: gradlaned (%s) took over endpoint %u's sequence from %llu\n",
               attach.shm_name.c_str(), attach.endpoint, static_cast<unsigned long long>(skip_below));
}

// Sidecar mode: what both the server and the replica have applied frees their slots.
void ShardServer::State::report_applied() {
  std::uint64_t through = order.next_sequence() - 1;
  if (replica) through = std::min(through, stats.replica_acked);
  if (through <= reported) return;
  sidecar->applied(through);
  reported = through;
}

void ShardServer::State::tell_replica(const AppliedUpdate& record) {
  if (!replica) return;
  try {
    replica->send(
        encode(Decided{record.sequence, record.skipped ? 0 : std::max<std::uint32_t>(record.worker, 1), record.tag}));
  } catch (const Error& e) {
    std::fprintf(stderr, "gradlane ps server: lost the replica: %s; serving without it\n", e.what());
    ++stats.peers_lost;
    replica.reset();
  }
}

// Replica whose server died: it becomes the server (direct mode) at the version it reached.
// A decided update whose mirror never came cannot be re-read from a dead server: skipped,
// counted lost. After the decided ones, the mirrors that arrived without a decision are
// applied too, in sequence order while there is no gap: their workers wrote them to us first
// and were told the push succeeded (acknowledged), and the dead server applied in sequence
// order, so this is the order it would have applied them in. Their history entries name the
// worker whose doorbell brought them; the tag (which only the dead server heard, in the
// request) is taken as one past that worker's last decided tag: exact for workers that tag
// their pushes with consecutive steps, as every user here does (each worker has one push in
// flight, and direct mode drops none), and 0 for a worker with no decided update. Mirrors
// after a gap (a sequence granted and never written to us) are lost, counted in
// lost_in_failover.
void ShardServer::State::promote() {
  const auto now = Clock::now();
  // Sidecar mode: refuse everything until we know from where on, and say so first (a worker
  // that failed over reads it after each write). A write whose READ of it came before this
  // store has its doorbell in our queue already, and the reap below takes it.
  if (options.sidecar) shard.header().refuse_below.store(~std::uint64_t{0}, std::memory_order_seq_cst);
  // Every mirror that is here counts. The failure was seen while input was being taken, so
  // doorbells of other workers may still wait, reaped or not (a worker acknowledged a push
  // whose mirror's doorbell was still in our queue, and it was skipped: kill:server@gradlane).
  while (cq.poll() > 0) {
  }
  for (Peer& peer : peers) {
    if (!peer.alive || peer.kind != PeerKind::worker) continue;
    try {
      take_doorbells(peer);
    } catch (const Error&) {  // its failure is taken up on the next round
    }
  }
  for (std::uint64_t head = order.next_sequence(); decisions.contains(head); ++head) {
    const bool apply = decisions.at(head).worker != 0;
    if (apply && arrived.contains(head)) {
      order.arrived(head, static_cast<std::uint32_t>(head % options.slots));
      fed[head] = decisions.at(head);
    } else {
      order.cancelled(head);
      stats.lost_in_failover += apply ? 1 : 0;
    }
  }
  // Acknowledged to their workers, undecided by the dead server: ours to apply.
  const auto next_tag = [this](std::uint32_t worker) -> std::uint64_t {
    for (auto it = fed.rbegin(); it != fed.rend(); ++it) {
      if (it->second.worker == worker) return it->second.tag + 1;
    }
    for (auto it = history.rbegin(); it != history.rend(); ++it) {
      if (!it->skipped && it->worker == worker) return it->tag + 1;
    }
    return 0;
  };
  std::uint64_t head = order.next_sequence() + order.pending();
  const auto take_mirror = [&](std::uint64_t sequence) {
    const std::uint32_t worker = std::max<std::uint32_t>(arrived.at(sequence), 1);
    order.arrived(sequence, static_cast<std::uint32_t>(sequence % options.slots));
    fed[sequence] = Decided{sequence, worker, next_tag(worker)};
  };
  for (; arrived.contains(head) && !decisions.contains(head); ++head) take_mirror(head);
  // Sidecar mode: mirrors after a gap too, the gaps skipped. A gap is a sequence the old owner
  // granted whose mirror is not here: its worker wrote nothing yet, or is writing now — the
  // sidecar that takes over starts `slots` further on, so that late write is refused (and its
  // worker, whose write to the dead server fails, hears the push was lost). The mirrors beyond
  // are acknowledged pushes whose workers' writes to the server completed (seen in the
  // kill:server fault: two lost behind one gap). In direct mode this server grants the gaps
  // again itself, so there they stay the end.
  if (options.sidecar && !arrived.empty()) {
    const std::uint64_t last = arrived.rbegin()->first;
    for (; head <= last && head < order.next_sequence() + options.slots; ++head) {
      if (arrived.contains(head)) {
        take_mirror(head);
      } else {
        order.cancelled(head);
      }
    }
  }
  for (const auto& [sequence, worker] : arrived) stats.lost_in_failover += sequence >= head ? 1 : 0;
  decisions.clear();
  arrived.clear();
  head_waiting_since.reset();
  next_grant = order.next_sequence() + order.pending();
  primary.reset();
  role = Role::server;
  stats.promoted_at_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  std::fprintf(stderr, "gradlane ps replica: promoted to server at sequence %llu (the server is gone)\n",
               static_cast<unsigned long long>(next_grant));
  if (options.sidecar) take_over_at_sidecar();
}

// Replica: turns the server's decision for the next sequence into an arrival or a cancel.
std::size_t ShardServer::State::decide_head() {
  std::size_t work = 0;
  for (;;) {
    const std::uint64_t head = order.next_sequence();
    if (order.next()) break;  // already decided, waiting to be applied
    const auto decision = decisions.find(head);
    if (decision == decisions.end()) break;
    if (decision->second.worker == 0) {
      order.cancelled(head);
    } else if (arrived.contains(head)) {
      order.arrived(head, static_cast<std::uint32_t>(head % options.slots));
    } else {
      // The server applied it but our mirror has not come: give the worker's write the hole
      // timeout (none when workers do not mirror), then read the update from the server's
      // slot, which the server keeps until we acknowledge it.
      const auto now = Clock::now();
      if (!head_waiting_since) head_waiting_since = now;
      const auto patience = options.read_updates_from_server ? Clock::duration::zero() : Clock::duration(options.hole_timeout);
      if (now - *head_waiting_since < patience || !primary) break;
      Connection& conn = peers[*primary].conn;
      const std::uint64_t offset = (head % options.slots) * slots.slot_bytes();
      // In pieces of at most 256 KiB, all posted before waiting: one 4 MiB READ over rxe took
      // ~4 s per update (the responder's burst of 4,096 packets; a lost one restarts the READ),
      // and a replica that reads slowly holds every slot. Bounded by the transport's own
      // give-up time, not hole_timeout: a peer that stopped answering fails the QP first.
      constexpr std::size_t kReadPiece = std::size_t{256} << 10;
      std::vector<OpId> pieces;
      for (std::size_t at = 0; at < slots.slot_bytes(); at += kReadPiece) {
        const std::size_t n = std::min(kReadPiece, slots.slot_bytes() - at);
        pieces.push_back(conn.read(slots.region(), offset + at, primary_slots, offset + at, n));
      }
      for (const OpId op : pieces) conn.wait(op, std::max<Millis>(options.hole_timeout, std::chrono::seconds(30)));
      order.arrived(head, static_cast<std::uint32_t>(head % options.slots));
      ++stats.mirrors_fetched;
    }
    head_waiting_since.reset();
    fed[head] = decision->second;
    decisions.erase(decision);
    arrived.erase(head);
    ++work;
  }
  return work;
}

// Floats applied between two looks at the network: 256 KiB, ~6 µs natively. A 4 MiB apply
// done in one piece kept the next request waiting a whole apply (perf/results/ps-push.md).
constexpr std::size_t kApplyChunkFloats = std::size_t{1} << 16;

void ShardServer::State::between_chunks() {
  // Direct mode: take requests and doorbells and grant free slots while the apply runs. The
  // slot being applied stays busy in `order` until done(), so nothing can be granted into it.
  if (role == Role::server && !sidecar) {
    take_input();
    grant();
  }
}

void ShardServer::State::apply_update(std::uint32_t slot) {
  const std::span<const float> gradient = slots.slot(slot);
  const std::span<float> model = shard.floats();
  ApplyGuard guard(writer);
  // Element-wise kernels: chunk by chunk gives bitwise the same floats as one call.
  for (std::size_t at = 0; at < model.size(); at += kApplyChunkFloats) {
    const std::size_t n = std::min(kApplyChunkFloats, model.size() - at);
    if (options.momentum > 0.0F) {
      sgd_momentum_step(model.subspan(at, n), std::span<float>(velocity).subspan(at, n), gradient.subspan(at, n),
                        options.learning_rate, options.momentum);
    } else {
      sgd_step(model.subspan(at, n), gradient.subspan(at, n), options.learning_rate);
    }
    if (at + n < model.size()) between_chunks();
  }
}

std::size_t ShardServer::State::apply() {
  std::size_t work = 0;
  while (const auto step = order.next()) {
    const bool skip = step->kind == Step::Kind::skip;
    if (skip) {
      writer.skip();
    } else {
      apply_update(step->slot);
    }
    (void)order.done(*step);
    AppliedUpdate record{step->sequence, 0, 0, 0, skip};
    if (const auto decided = fed.extract(step->sequence); !decided.empty()) {  // as the server decided it
      if (!skip) {
        record.worker = decided.mapped().worker;
        record.tag = decided.mapped().tag;
      }
    } else if (role == Role::server && sidecar) {
      const auto from = rung_by.extract(step->sequence);
      if (!from.empty() && !skip) {
        record.worker = from.mapped();
        record.tag = arrivals[record.worker]++;  // the worker's n-th update: its step, if none was dropped
      }
    } else if (role == Role::server) {
      const auto info = granted.extract(step->sequence);
      if (!info.empty() && !skip) {
        record = {step->sequence, info.mapped().worker, info.mapped().tag, info.mapped().computed_on, skip};
      }
    }
    if (role == Role::server) tell_replica(record);
    ++(skip ? stats.skipped : stats.applied);
    history.push_back(record);
    ++work;
  }
  if (role == Role::replica && primary && peers[*primary].alive && order.next_sequence() - 1 > acked) {
    acked = order.next_sequence() - 1;
    try {
      peers[*primary].conn.send(encode(Ack{acked}));
    } catch (const Error& e) {
      lose(peers[*primary], e);
    }
  }
  return work;
}

ShardServer::ShardServer(const Device& device, Role role, std::uint16_t port, const ShardOptions& options,
                         std::span<const float> initial) {
  if (options.floats == 0 || options.slots == 0) {
    throw Error(Errc::invalid_argument, "ShardServer: the shard needs floats > 0 and slots > 0");
  }
  if (initial.size() != options.floats) {
    throw Error(Errc::invalid_argument, fmt::format("ShardServer: initial model has {} floats, the shard {}",
                                                    initial.size(), options.floats));
  }
  state_ = std::make_unique<State>(device, role, port, options);
  std::copy(initial.begin(), initial.end(), state_->shard.floats().begin());
  if (options.sidecar && role == Role::server) {  // a replica attaches when promoted
    sidecar::AttachOptions attach = *options.sidecar;
    attach.region_bytes = state_->slots.slot_bytes() * options.slots;
    state_->sidecar.emplace(sidecar::Client::attach(attach));
  }
  if (options.momentum > 0.0F) state_->velocity.assign(options.floats, 0.0F);
}

ShardServer::ShardServer(ShardServer&&) noexcept = default;
ShardServer& ShardServer::operator=(ShardServer&&) noexcept = default;
ShardServer::~ShardServer() {
  // A server that goes away cleanly first hands its replica every decision it made (bounded):
  // otherwise the replica, promoted by the disconnect, loses the last ones (seen in CI: the
  // README example's replica ended at version 19 of 20).
  if (!state_) return;
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
  s.replica.emplace(std::move(conn));
}

void ShardServer::State::advertise(Connection& conn) {
  conn.advertise(kSlotRegionId, slots.region().descriptor());
  conn.advertise(kShardRegionId, shard.region().descriptor());
}

void ShardServer::accept_peers(std::size_t workers, Millis timeout) {
  State& s = *state_;
  const std::size_t expected = workers + (s.role == Role::replica ? 1 : 0);
  const auto advertise = [&](Connection& conn) { s.advertise(conn); };
  for (Joined& j : accept_hellos(s.listener, expected, advertise, timeout, s.role == Role::server ? "server" : "replica")) {
    if (j.hello.kind == PeerKind::primary) {
      if (s.role != Role::replica || s.primary) throw Error(Errc::protocol, "a second primary, or a primary at a server");
      s.primary_slots = j.conn.wait_region(kSlotRegionId, timeout);
      s.primary = s.peers.size();
    }
    s.peers.push_back(Peer{std::move(j.conn), j.hello.kind, j.hello.worker, true, {}, {}, {}, false, false});
  }
  s.admitting = true;
}

// Membership after the start: connections accepted from the poll loop (one non-blocking look
// every so many rounds: a restart is rare, a round is not), advertised to, and admitted when
// their hello comes. Each late connection's failure is its own; the job goes on.
std::size_t ShardServer::State::admit_joiners() {
  if (!admitting || rounds % 64 != 0) return 0;  // rounds: counted by progress()
  std::size_t work = 0;
  const char* who = role == Role::server ? "server" : "replica";
  try {
    while (auto conn = listener.try_accept()) {
      ++work;
      try {
        advertise(*conn);
        joining.push_back(Joining{std::move(*conn), Clock::now() + options.transport.connect_timeout});
      } catch (const Error& e) {
        ++stats.joins_refused;
        std::fprintf(stderr, "gradlane ps %s: dropped a late connection before its hello: %s\n", who, e.what());
      }
    }
  } catch (const Error& e) {  // the listener's own failure: no more joins, the job goes on
    std::fprintf(stderr, "gradlane ps %s: stopped admitting workers: %s\n", who, e.what());
    admitting = false;
  }
  for (auto it = joining.begin(); it != joining.end();) {
    try {
      const auto hello = try_hello(it->conn);
      if (!hello) {
        if (Clock::now() < it->deadline) {
          ++it;
          continue;
        }
        throw Error(Errc::timeout, fmt::format("no hello within {} ms", options.transport.connect_timeout.count()));
      }
      if (hello->kind != PeerKind::worker) {
        throw Error(Errc::protocol, "a connection accepted after the start said hello as a primary, not a worker");
      }
      admit(std::move(it->conn), *hello);
      ++work;
    } catch (const Error& e) {
      ++stats.joins_refused;
      std::fprintf(stderr, "gradlane ps %s: refused a late connection (%s): %s\n", who, it->conn.describe().c_str(), e.what());
    }
    it = joining.erase(it);
  }
  return work;
}

// A worker that connects under an id whose old connection still looks alive was restarted
// before its old connection failed here (a process killed and started again within the ACK
// timeout): the new connection supersedes the old one, which is written off as lost — its
// granted sequences become holes, skipped in order, exactly as if it had failed.
void ShardServer::State::admit(Connection conn, const Hello& hello) {
  for (Peer& old : peers) {
    if (old.alive && old.kind == PeerKind::worker && old.worker == hello.worker) {
      lose(old, Error(Errc::protocol, fmt::format("worker {} connected again ({}): this older connection is "
                                                  "superseded", hello.worker, conn.describe())));
    }
  }
  peers.push_back(Peer{std::move(conn), PeerKind::worker, hello.worker, true, {}, {}, {}, false, false});
  ++stats.peers_joined;
  std::fprintf(stderr, "gradlane ps %s: worker %u joined the running job\n", role == Role::server ? "server" : "replica",
               hello.worker);
}

// A worker connection the server only answers goes silent when the worker's host or link
// dies without a disconnect (the CM's disconnect request lost with the link): nothing would
// ever fail it, and the server would wait for that worker forever (seen over Soft-RoCE: a
// worker host's link down 4 s, both its workers exited, the server waited 300 s and more).
// So once a second every idle worker connection gets a zero-length probe; a dead peer fails
// it within the transport's ACK timeout and retries (~2 s), and lose() skips its sequences.
void ShardServer::State::probe_idle_workers() {
  if (rounds % 256 != 0) return;
  const auto now = Clock::now();
  if (now - last_probe < std::chrono::seconds(1)) return;
  last_probe = now;
  for (Peer& peer : peers) {
    if (!peer.alive || peer.kind != PeerKind::worker || peer.conn.outstanding() != 0) continue;
    try {
      peer.conn.probe();
    } catch (const Error& e) {
      lose(peer, e);
    }
  }
}

std::size_t ShardServer::progress() {
  State& s = *state_;
  ++s.rounds;
  std::size_t work = s.take_input();
  if (s.role == Role::server) s.probe_idle_workers();
  work += s.admit_joiners();
  if (s.role == Role::server && s.sidecar) {
    work += s.take_sidecar();
    if (s.order.next_sequence() < s.skip_below) work += s.skip_old_owners_sequences();
    work += s.skip_stuck_head();
    work += s.apply();
    s.report_applied();
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
  if (s.role == Role::server && s.sidecar) return live_workers() == 0 && s.order.pending() == 0;
  if (s.role == Role::server && s.stats.stepped_down) return s.granted.empty() && s.order.pending() == 0;
  if (s.role == Role::server) {
    return live_workers() == 0 && s.waiting.empty() && s.granted.empty() && s.order.pending() == 0;
  }
  return (!s.primary || !s.peers[*s.primary].alive) && s.decisions.empty() && !s.order.next();
}

std::uint64_t ShardServer::version() const { return state_->writer.model_version(); }
std::span<const float> ShardServer::model() const { return state_->shard.floats(); }
const ServerStats& ShardServer::stats() const { return state_->stats; }
const std::vector<AppliedUpdate>& ShardServer::history() const { return state_->history; }
std::size_t ShardServer::live_workers() const {
  std::size_t n = 0;
  for (const Peer& p : state_->peers) n += p.alive && p.kind == PeerKind::worker;
  return n;
}

}  // namespace gradlane::ps
