// DirectMembers: a direct-mode aggregator's grants, member slots and groups
// (direct_members.hpp; the protocol: include/gradlane/ps.hpp, "Aggregation").
#include "ps/aggregator/direct_members.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <span>
#include <utility>

#include "ps/aggregator/aggregator_state.hpp"
#include "ps/protocol/join.hpp"
#include "ps/receiving/kernels.hpp"
#include "ps/receiving/outstanding_grants.hpp"

namespace gradlane::ps {

DirectMembers::DirectMembers(const Device& device, const AggregatorOptions& options, std::uint32_t slots)
    : slot_count_(slots),
      hole_timeout_(options.hole_timeout),
      linger_(options.linger),
      ring_(device, options.floats, slots),
      order_(slots, 1),
      group_(std::max<std::uint32_t>(options.group, 1)) {}

void DirectMembers::accept(Aggregator::State& s, std::size_t workers, Millis timeout) {
  // Kept by LateJoins too: it holds the ring (ours, which outlives it), not this frame.
  const auto advertise = [ring = &ring_](Connection& conn) {
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

std::size_t DirectMembers::progress(Aggregator::State& s) {
  std::size_t work = s.admit_joiners();
  work += s.probe_idle_members();
  work += take_input(s);
  work += expire_holes(s);
  work += grant(s);
  work += collect(s);
  if (group_due(s)) {
    forward_group(s);
    ++work;
    work += grant(s);  // the summed members' slots are free again
  }
  return work;
}

bool DirectMembers::owes(const std::vector<MemberPeer>& peers, const MemberPeer& peer) const {
  return !peer.outstanding.empty() ||
         std::any_of(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return &peers[w.peer] == &peer; });
}

void DirectMembers::forget(MemberPeer& peer) {
  for (const std::uint64_t sequence : peer.outstanding.take_all()) order_.cancelled(sequence);
}

std::size_t DirectMembers::take_input(Aggregator::State& s) {
  std::size_t work = 0;
  for (std::size_t i = 0; i < s.peers.size(); ++i) {
    if (!s.peers[i].alive) continue;
    try {
      work += take_from(s, i);
    } catch (const Error& e) {
      s.lose(s.peers[i], e);
      ++work;
    }
  }
  return work;
}

std::size_t DirectMembers::take_from(Aggregator::State& s, std::size_t index) {
  MemberPeer& peer = s.peers[index];
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
    waiting_.push_back({index, *request});
  }
  while (auto bell = peer.conn.try_doorbell()) {
    ++work;
    const std::uint64_t sequence = ApplyOrder::widen(bell->imm, order_.next_sequence());
    // Only the worker it was granted to may ring for a member sequence, once.
    if (!peer.outstanding.ring(sequence) ||
        order_.arrived(sequence, static_cast<std::uint32_t>(sequence % slot_count_)) != Admit::accepted) {
      ++s.stats.refused_doorbells;
      // A write after its grant was written off (the worker stalled past hole_timeout): its
      // push returned, pending; it is never summed, so say so (a worker ignores a member it
      // does not know).
      PushResult left_out;
      left_out.lost = true;
      s.tell_forwarded(peer, sequence, left_out);
    }
  }
  return work;
}

std::size_t DirectMembers::grant(Aggregator::State& s) {
  std::size_t work = 0;
  const HeldSlots held(s.peers, slot_count_);
  while (!waiting_.empty() && !held.all() && member_slot_free(next_grant_, held_from(), slot_count_)) {
    if (held.holds(next_grant_)) {  // granted to nobody, left out
      order_.cancelled(next_grant_++);
      ++work;
      continue;
    }
    const Waiting w = waiting_.front();
    waiting_.pop_front();
    MemberPeer& peer = s.peers[w.peer];
    if (!peer.alive) continue;
    const std::uint64_t sequence = next_grant_;
    try {
      peer.conn.send(encode(Grant{sequence, w.request.tag}));
    } catch (const Error& e) {
      s.lose(peer, e);
      continue;
    }
    peer.outstanding.add(sequence, Clock::now());
    GroupMember member;
    member.sequence = sequence;
    member.slot = static_cast<std::uint32_t>(sequence % slot_count_);
    member.worker = peer.worker;
    member.tag = w.request.tag;
    member.computed_on = w.request.computed_on;
    member.peer = w.peer;
    granted_[sequence] = member;
    ++next_grant_;
    ++s.stats.granted;
    ++work;
  }
  return work;
}

std::size_t DirectMembers::expire_holes(Aggregator::State& s) {
  return ps::expire_holes(
      s.peers, hole_timeout_, [&] { return take_input(s); },
      [&](MemberPeer& peer, std::uint64_t sequence) {
        std::fprintf(stderr,
                     "gradlane ps aggregator: worker %u was granted member %llu and wrote nothing in %lld ms: "
                     "left out; its slot is not reused until the worker asks again (its write may still land)\n",
                     peer.worker, static_cast<unsigned long long>(sequence),
                     static_cast<long long>(hole_timeout_.count()));
        order_.cancelled(sequence);
        peer.outstanding.may_still_land(sequence);
      });
}

// Moves members that arrived, in sequence order, into the open group (holes are dropped),
// until the group is full. A member's slot stays busy until its group is summed.
std::size_t DirectMembers::collect(Aggregator::State& s) {
  std::size_t work = 0;
  while (!group_.full()) {
    const auto step = order_.next();
    if (!step) break;
    const auto member = granted_.extract(step->sequence);
    if (step->kind == Step::Kind::apply && !member.empty()) {
      group_.add(member.mapped());
      last_member_ = Clock::now();
    } else {
      ++s.stats.skipped;
    }
    (void)order_.done(*step);
    ++work;
  }
  return work;
}

bool DirectMembers::group_due(const Aggregator::State& s) const {
  if (group_.full()) return true;
  if (group_.empty() || !granted_.empty() || !waiting_.empty()) return false;
  // Nothing is on its way: forward short rather than hold gradients without bound.
  // A worker that said it pushes no more (its Bye; Worker::settle) waits for its members'
  // outcomes: it is not one to wait for.
  const bool anyone_pushing =
      std::any_of(s.peers.begin(), s.peers.end(), [](const MemberPeer& p) { return p.alive && !p.said_bye; });
  return !anyone_pushing || Clock::now() - last_member_ >= linger_;
}

void DirectMembers::forward_group(Aggregator::State& s) {
  const std::vector<GroupMember> members = group_.take();  // in sum order
  std::vector<std::span<const float>> parts;
  parts.reserve(members.size());
  for (const GroupMember& m : members) parts.push_back(ring_.slot(m.slot));
  // Straight into the registered buffer the forward writes from; the members' slots are free
  // once this returns.
  sum_in_order(s.forward.gradient(), parts);
  const std::uint64_t forward_copied = s.forward.bytes_copied();
  AggregatedUpdate update;
  update.tag = s.history.size() + 1;
  update.computed_on = oldest_computed_on(members);
  for (const GroupMember& m : members) update.members.push_back({m.worker, m.tag, m.computed_on});
  const PushResult pushed = s.push_forward(update.computed_on, update.tag);
  // Copies: the forward's inline payloads, and a short group of one, whose "sum" the kernel
  // copied from the member's slot.
  s.stats.bytes_copied += s.forward.bytes_copied() - forward_copied + (members.size() == 1 ? ring_.slot_bytes() : 0);
  update.sequence = pushed.sequence;
  update.lost = pushed.lost;
  // Each member's own connection: a worker restarted under the same id never hears of its old
  // process's members.
  for (const GroupMember& m : members) {
    if (s.peers[m.peer].alive) s.tell_forwarded(s.peers[m.peer], m.sequence, pushed);
  }
  ++s.stats.forwarded;
  s.stats.summed += members.size();
  s.stats.short_groups += members.size() < group_.size() ? 1 : 0;
  s.stats.lost += pushed.lost ? 1 : 0;
  s.history.push_back(std::move(update));
}

}  // namespace gradlane::ps
