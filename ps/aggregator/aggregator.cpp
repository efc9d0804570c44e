// Aggregator: sums groups of workers' updates and forwards each sum to the shard server (and
// its replica) as one update (protocol: include/gradlane/ps.hpp, "Aggregation").
//
// Towards its workers it is a small server: it grants member sequence numbers in request order
// while their slot in its ring is free, takes doorbells only from the worker a sequence was
// granted to, and releases members in sequence order (ApplyOrder), holes skipped. Towards the
// shard it is one ps::Worker: the group is summed straight into that worker's registered
// gradient buffer (the kernel writes it; nothing is copied) and pushed from there.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "gradlane/ps/aggregator.hpp"
#include "ps/aggregator/aggregator_state.hpp"
#include "ps/protocol/join.hpp"
#include "ps/receiving/kernels.hpp"

namespace gradlane::ps {
namespace {

using Clock = std::chrono::steady_clock;

std::uint32_t ring_slots(const AggregatorOptions& o) {
  if (o.slots != 0) return o.slots;
  return o.sidecar ? 16 : 2 * o.group;  // sidecar mode: per worker (aggregate id % slots)
}

WorkerOptions forward_options(const AggregatorOptions& o) {
  WorkerOptions w;
  w.id = o.id;
  w.server = o.server;
  w.replica = o.replica;
  w.floats = o.floats;
  w.tensor = o.tensor;
  w.timeout = o.timeout;
  w.transport = o.transport;
  return w;
}

}  // namespace

Aggregator::State::State(const Device& dev, std::uint16_t port, const AggregatorOptions& o)
    : device(dev),
      options(o),
      slot_count(ring_slots(o)),
      order(slot_count, 1),
      group(std::max<std::uint32_t>(o.group, 1)),
      listener(dev, port, o.transport),
      forward(dev, forward_options(o)) {
  if (!o.sidecar) ring.emplace(dev, o.floats, slot_count);
}

void Aggregator::State::lose(MemberPeer& peer, const Error& why) {
  if (!peer.alive) return;
  peer.alive = false;
  peer.conn.close();  // a peer written off here is told (see ShardServer::State::lose)
  const bool owes = !peer.outstanding.empty() || std::any_of(waiting.begin(), waiting.end(),
                                                             [&](const Waiting& w) { return &peers[w.peer] == &peer; });
  if (left_cleanly(peer.said_bye, owes)) {
    ++stats.peers_left;
    return;
  }
  ++stats.peers_lost;
  std::fprintf(stderr, "gradlane ps aggregator: lost worker %u%s: %s\n", peer.worker, lost_note(owes), why.what());
  // Its granted members will never be written: left out of their group, in order.
  for (const std::uint64_t sequence : peer.outstanding.take_all()) order.cancelled(sequence);
}

std::size_t Aggregator::State::probe_idle_members() {
  return idle_probe.run(
      peers, [](const MemberPeer&) { return true; }, [&](MemberPeer& peer, const Error& e) { lose(peer, e); });
}

std::size_t Aggregator::State::take_from(std::size_t index) {
  MemberPeer& peer = peers[index];
  std::size_t work = 0;
  while (auto bytes = peer.conn.try_receive()) {
    ++work;
    const Message message = decode(*bytes);
    if (take_bye(message, peer.worker, peer.said_bye)) continue;
    const auto* request = std::get_if<Request>(&message);
    if (request == nullptr) {
      throw Error(Errc::protocol, fmt::format("unexpected message (kind {}) at an aggregator", message.index() + 1));
    }
    if (request->worker != peer.worker) {
      throw Error(Errc::protocol,
                  fmt::format("request names worker {} on the connection of worker {}", request->worker, peer.worker));
    }
    peer.outstanding.asked_again();
    waiting.push_back({index, *request});
  }
  while (auto bell = peer.conn.try_doorbell()) {
    ++work;
    const std::uint64_t sequence = ApplyOrder::widen(bell->imm, order.next_sequence());
    // Only the worker it was granted to may ring for a member sequence, once.
    if (!peer.outstanding.ring(sequence) ||
        order.arrived(sequence, static_cast<std::uint32_t>(sequence % slot_count)) != Admit::accepted) {
      ++stats.refused_doorbells;
      // A write after its grant was written off (the worker stalled past hole_timeout): its
      // push returned, pending; it is never summed, so say so (a worker ignores a member it
      // does not know).
      PushResult left_out;
      left_out.lost = true;
      tell_forwarded(peer, sequence, left_out);
    }
  }
  return work;
}

std::size_t Aggregator::State::take_input() {
  std::size_t work = 0;
  for (std::size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i].alive) continue;
    try {
      work += take_from(i);
    } catch (const Error& e) {
      lose(peers[i], e);
      ++work;
    }
  }
  return work;
}

std::size_t Aggregator::State::grant() {
  std::size_t work = 0;
  const std::vector<bool> held = slots_held_for_late_writes(peers, slot_count);
  const bool all_held = !held.empty() && std::ranges::all_of(held, std::identity{});
  while (!waiting.empty() && !all_held && member_slot_free(next_grant, held_from(), slot_count)) {
    if (!held.empty() && held[next_grant % slot_count]) {  // granted to nobody, left out
      order.cancelled(next_grant++);
      ++work;
      continue;
    }
    const Waiting w = waiting.front();
    waiting.pop_front();
    MemberPeer& peer = peers[w.peer];
    if (!peer.alive) continue;
    const std::uint64_t sequence = next_grant;
    try {
      peer.conn.send(encode(Grant{sequence, w.request.tag}));
    } catch (const Error& e) {
      lose(peer, e);
      continue;
    }
    peer.outstanding.add(sequence, Clock::now());
    GroupMember member;
    member.sequence = sequence;
    member.slot = static_cast<std::uint32_t>(sequence % slot_count);
    member.worker = peer.worker;
    member.tag = w.request.tag;
    member.computed_on = w.request.computed_on;
    member.peer = w.peer;
    granted[sequence] = member;
    ++next_grant;
    ++stats.granted;
    ++work;
  }
  return work;
}

std::size_t Aggregator::State::expire_holes() {
  return ps::expire_holes(
      peers, options.hole_timeout, [&] { return take_input(); },
      [&](MemberPeer& peer, std::uint64_t sequence) {
        std::fprintf(stderr,
                     "gradlane ps aggregator: worker %u was granted member %llu and wrote nothing in %lld ms: "
                     "left out; its slot is not reused until the worker asks again (its write may still land)\n",
                     peer.worker, static_cast<unsigned long long>(sequence),
                     static_cast<long long>(options.hole_timeout.count()));
        order.cancelled(sequence);
        peer.outstanding.may_still_land(sequence);
      });
}

// Moves members that arrived, in sequence order, into the open group (holes are dropped),
// until the group is full. A member's slot stays busy until its group is summed.
std::size_t Aggregator::State::collect() {
  std::size_t work = 0;
  while (!group.full()) {
    const auto step = order.next();
    if (!step) break;
    const auto member = granted.extract(step->sequence);
    if (step->kind == Step::Kind::apply && !member.empty()) {
      group.add(member.mapped());
      last_member = Clock::now();
    } else {
      ++stats.skipped;
    }
    (void)order.done(*step);
    ++work;
  }
  return work;
}

bool Aggregator::State::group_due() const {
  if (group.full()) return true;
  if (group.empty() || !granted.empty() || !waiting.empty()) return false;
  // Nothing is on its way: forward short rather than hold gradients without bound.
  // A worker that said it pushes no more (its Bye; Worker::settle) waits for its members'
  // outcomes: it is not one to wait for.
  const bool anyone_pushing =
      std::any_of(peers.begin(), peers.end(), [](const MemberPeer& p) { return p.alive && !p.said_bye; });
  return !anyone_pushing || Clock::now() - last_member >= options.linger;
}

void Aggregator::State::forward_group() {
  const std::vector<GroupMember> members = group.take();  // in sum order
  std::vector<std::span<const float>> parts;
  parts.reserve(members.size());
  for (const GroupMember& m : members) parts.push_back(ring->slot(m.slot));
  // Straight into the registered buffer the forward writes from; the members' slots are free
  // once this returns.
  sum_in_order(forward.gradient(), parts);
  const std::uint64_t forward_copied = forward.bytes_copied();
  AggregatedUpdate update;
  update.tag = history.size() + 1;
  update.computed_on = oldest_computed_on(members);
  for (const GroupMember& m : members) update.members.push_back({m.worker, m.tag, m.computed_on});
  const PushResult pushed = push_forward(update.computed_on, update.tag);
  // Copies: the forward's inline payloads, and a short group of one, whose "sum" the kernel
  // copied from the member's slot.
  stats.bytes_copied += forward.bytes_copied() - forward_copied + (members.size() == 1 ? ring->slot_bytes() : 0);
  update.sequence = pushed.sequence;
  update.lost = pushed.lost;
  // Each member's own connection: a worker restarted under the same id never hears of its old
  // process's members.
  for (const GroupMember& m : members) {
    if (peers[m.peer].alive) tell_forwarded(peers[m.peer], m.sequence, pushed);
  }
  ++stats.forwarded;
  stats.summed += members.size();
  stats.short_groups += members.size() < group.size() ? 1 : 0;
  stats.lost += pushed.lost ? 1 : 0;
  history.push_back(std::move(update));
}

template <typename Push>
PushResult Aggregator::State::rejoining_if_out_of_reach(Push&& push) {
  try {
    return push();
  } catch (const Error& e) {
    if (options.rejoin_within.count() == 0 || !out_of_reach(e)) throw;
    rejoin_forward(e);
    PushResult lost;
    lost.lost = true;
    return lost;
  }
}

PushResult Aggregator::State::push_forward(std::uint64_t computed_on, std::uint64_t tag) {
  return rejoining_if_out_of_reach([&] { return forward.push(computed_on, tag); });
}

PushResult Aggregator::State::write_forward(std::uint64_t sequence, std::uint64_t token) {
  return rejoining_if_out_of_reach([&] { return forward.write_as(sequence, token); });
}

// The forward lost the server and the replica (a link down): a new connection to the running
// job, as a worker rejoins (the server admits it as a late joiner and supersedes the old one),
// retried until rejoin_within; its sums go on from a new registered buffer.
void Aggregator::State::rejoin_forward(const Error& why) {
  const auto lost_at = Clock::now();
  const auto deadline = lost_at + options.rejoin_within;
  std::fprintf(stderr, "gradlane ps aggregator: lost its server (%s); rejoining the job for up to %lld ms\n",
               why.what(), static_cast<long long>(options.rejoin_within.count()));
  for (;;) {
    WorkerOptions w = forward_options(options);
    w.connect_within = std::max(std::chrono::ceil<Millis>(deadline - Clock::now()), Millis(1));
    try {
      forward = Worker(device, w);
      forward.announce_aggregator(listener.address(), listener.port());
      ++stats.rejoins;
      std::fprintf(stderr, "gradlane ps aggregator: rejoined the job %.3f s after losing it\n",
                   std::chrono::duration<double>(Clock::now() - lost_at).count());
      return;
    } catch (const Error& e) {
      if (!out_of_reach(e) || Clock::now() >= deadline) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

void Aggregator::State::tell_forwarded(MemberPeer& peer, std::uint64_t member, const PushResult& pushed) {
  try {
    peer.conn.send(encode(Forwarded{member, pushed.lost ? 0 : pushed.sequence, !pushed.lost}));
  } catch (const Error& e) {
    lose(peer, e);
  }
}

// Workers that come after the start: to a restarted aggregator, the ones that lost it (the
// server told them where it listens again), in either mode. One connecting under the id of a
// connection that still looks alive supersedes it.
std::size_t Aggregator::State::admit_joiners() {
  if (!late || ++rounds % 64 != 0) return 0;
  std::size_t work = 0;
  for (Joined& j : late->poll()) {
    ++work;
    if (j.hello.kind != PeerKind::worker) {
      late->refuse(j.conn, Error(Errc::protocol, "only workers join an aggregator"));
      continue;
    }
    for (MemberPeer& old : peers) {
      if (old.alive && old.worker == j.hello.worker) {
        lose(old, Error(Errc::protocol,
                        fmt::format("worker {} connected again: this older connection is superseded", j.hello.worker)));
      }
    }
    MemberPeer peer{std::move(j.conn), j.hello.worker, true, {}};
    // Sidecar mode: the partition its connection was advertised (see accept_sidecar_workers).
    if (partitions) peer.partition = partitions->partition_of(first_late_advertised + j.accepted);
    peers.push_back(std::move(peer));
    ++stats.peers_joined;
    std::fprintf(stderr, "gradlane ps aggregator: worker %u joined\n", j.hello.worker);
  }
  return work;
}

std::size_t Aggregator::State::progress_direct() {
  std::size_t work = admit_joiners();
  work += probe_idle_members();
  work += take_input();
  work += expire_holes();
  work += grant();
  work += collect();
  if (group_due()) {
    forward_group();
    ++work;
    work += grant();  // the summed members' slots are free again
  }
  return work;
}

Aggregator::Aggregator(const Device& device, std::uint16_t port, const AggregatorOptions& options) {
  if (options.id == 0 || options.floats == 0 || options.group == 0) {
    throw Error(Errc::invalid_argument, "ps::Aggregator: the id must be > 0, the shard must have floats, group >= 1");
  }
  if (!options.sidecar && options.slots != 0 && options.slots < options.group) {
    throw Error(Errc::invalid_argument, fmt::format("ps::Aggregator: {} member slots cannot hold a group of {}; "
                                                    "give slots >= group (or 0 for 2 × group)",
                                                    options.slots, options.group));
  }
  if (options.grant_windows && !options.sidecar) {
    throw Error(Errc::invalid_argument,
                "ps::Aggregator: grant_windows needs sidecar mode (in direct mode the members "
                "share the ring's slots by sequence, so there is no partition to confine a "
                "worker to)");
  }
  if (options.grant_windows && !device.info().memory_windows) {
    throw Error(Errc::unsupported, fmt::format("ps::Aggregator: grant_windows: {} has no type-2 memory windows; "
                                               "without them any worker may write any member slot",
                                               device.info().name));
  }
  state_ = std::make_unique<State>(device, port, options);
  state_->forward.announce_aggregator(state_->listener.address(), state_->listener.port());
  if (options.sidecar) {
    sidecar::AttachOptions attach = *options.sidecar;
    attach.region_bytes = options.floats * sizeof(float);
    state_->sidecar.emplace(sidecar::Client::attach(attach));
  }
}

Aggregator::Aggregator(Aggregator&&) noexcept = default;
Aggregator& Aggregator::operator=(Aggregator&&) noexcept = default;
Aggregator::~Aggregator() = default;

std::uint16_t Aggregator::port() const { return state_->listener.port(); }

void Aggregator::accept_workers(std::size_t workers, Millis timeout) {
  State& s = *state_;
  if (s.sidecar_mode()) return s.accept_sidecar_workers(workers, timeout);
  // Kept by LateJoins too: it holds the ring (the state's, which outlives it), not this frame.
  const auto advertise = [ring = &*s.ring](Connection& conn) {
    conn.advertise(kSlotRegionId, ring->region().descriptor());
  };
  for (Joined& j : accept_hellos(s.listener, workers, advertise, timeout, "aggregator")) {
    if (j.hello.kind != PeerKind::worker) {
      throw Error(Errc::protocol, fmt::format("{}: only workers join an aggregator", j.conn.describe()));
    }
    s.peers.push_back(MemberPeer{std::move(j.conn), j.hello.worker, true, {}});
  }
  s.late.emplace(s.listener, advertise, s.options.transport.connect_timeout, "aggregator");
}

std::size_t Aggregator::progress() {
  State& s = *state_;
  return s.sidecar_mode() ? s.progress_sidecar() : s.progress_direct();
}

bool Aggregator::run(Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  std::uint32_t idle = 0;
  while (!finished()) {
    if (progress() != 0) continue;
    if (++idle % 64 == 0 && Clock::now() > deadline) return false;
  }
  return true;
}

bool Aggregator::finished() const {
  const State& s = *state_;
  if (s.sidecar_mode()) return s.finished_sidecar();
  return !s.peers.empty() && live_workers() == 0 && s.waiting.empty() && s.granted.empty() && s.order.pending() == 0 &&
         s.group.empty();
}

const AggregatorStats& Aggregator::stats() const { return state_->stats; }
const std::vector<AggregatedUpdate>& Aggregator::history() const { return state_->history; }
std::span<const float> Aggregator::last_sum() const { return state_->forward.gradient(); }
std::size_t Aggregator::live_workers() const {
  std::size_t n = 0;
  for (const MemberPeer& p : state_->peers) n += p.alive ? 1 : 0;
  return n;
}

}  // namespace gradlane::ps
