// SidecarMembers: a sidecar-mode aggregator's partitions, aggregate grants and forwards
// (sidecar_members.hpp).
#include "ps/aggregator/sidecar_members.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "ps/aggregator/aggregator_state.hpp"
#include "ps/protocol/join.hpp"
#include "ps/receiving/kernels.hpp"
#include "ps/protocol/slot_wait.hpp"

namespace gradlane::ps {
namespace {

using Clock = std::chrono::steady_clock;

// Connections beyond the expected workers that may hold a partition of the ring at once: a
// worker back after a restart takes one before its old one is given back (reclaim_partitions),
// and a connection advertised to holds one until its hello, or until it is dropped without one.
constexpr std::uint32_t kSparePartitions = 4;

// A partition back to the pool, its window (if any) dropped: its connection is closed, so
// nothing more lands there.
void release_partition(PartitionPool& pool, std::vector<std::optional<MemoryWindow>>& windows,
                       std::uint32_t partition) {
  windows[partition].reset();
  pool.give_back(partition);
}

// Members whose aggregate was never granted (its grant went elsewhere or the sidecar was lost)
// are given up after this long, so their slots come back.
constexpr std::chrono::seconds kUngrantedLimit{30};

}  // namespace

SidecarMembers::SidecarMembers(const AggregatorOptions& options, std::uint32_t slots)
    : slot_count_(slots), sidecar_([&] {
        sidecar::AttachOptions attach = *options.sidecar;
        attach.region_bytes = options.floats * sizeof(float);
        return sidecar::Client::attach(attach);
      }()) {}

std::uint32_t SidecarMembers::late_partition(std::size_t accepted) const {
  return partitions_->partition_of(first_late_advertised_ + accepted);
}

void SidecarMembers::accept(Aggregator::State& s, std::size_t workers, Millis timeout) {
  if (book_) throw Error(Errc::invalid_argument, "ps::Aggregator: in sidecar mode, accept_workers() once");
  const auto count = static_cast<std::uint32_t>(std::max<std::size_t>(workers, s.options.workers)) + kSparePartitions;
  ring_.emplace(s.device, s.options.floats, count * slot_count_, s.options.grant_windows, slot_count_);
  book_.emplace(count, slot_count_);
  // Each connection gets its own partition of the ring: slot_count_ member slots, as it is
  // advertised to — at the start, and later (a worker back at a restarted aggregator, or after
  // its own restart) from the poll loop, which is why the lambda holds the pool, not this frame.
  const RegionDescriptor whole = ring_->region().descriptor();
  const std::uint64_t partition_bytes = std::uint64_t{slot_count_} * ring_->slot_bytes();
  partitions_ = std::make_shared<PartitionPool>(count);
  partition_windows_ = std::make_shared<std::vector<std::optional<MemoryWindow>>>(count);
  const SlotRing* windowed = s.options.grant_windows ? &*ring_ : nullptr;  // the ring outlives the joins
  const auto advertise = [pool = partitions_, windows = partition_windows_, windowed, whole, partition_bytes,
                          dev = s.device, count](Connection& conn) {
    const auto index = pool->take();
    if (!index) {
      throw Error(Errc::resource_exhausted,
                  fmt::format("all {} partitions of the member ring are held (AggregatorOptions::workers + {} spare): "
                              "a worker's comes back once it is gone and its members were forwarded",
                              count, kSparePartitions));
    }
    RegionDescriptor mine = whole;
    mine.addr += *index * partition_bytes;
    mine.length = partition_bytes;
    try {
      if (windowed != nullptr) {  // its partition alone, on its connection alone (bound before the advertisement)
        std::optional<MemoryWindow>& window = (*windows)[*index];
        window.emplace(MemoryWindow::allocate(dev));
        conn.bind_window(*window, windowed->window_region(*index), 0, partition_bytes, Access::remote_write);
        mine.rkey = window->rkey();
      }
      conn.advertise(kSlotRegionId, mine);
    } catch (const Error&) {
      release_partition(*pool, *windows, *index);  // it never learned where its partition is
      throw;
    }
  };
  // A connection dropped before its hello (a half-open retry, join.hpp) gives its partition back
  // at once: nothing of it can land any more, and no member of it was booked. `first`: the
  // advertisement that numbered 0 for the accepting call.
  const auto give_back = [pool = partitions_, windows = partition_windows_](std::size_t first) {
    return [pool, windows, first](std::size_t accepted) {
      release_partition(*pool, *windows, pool->partition_of(first + accepted));
    };
  };
  for (Joined& j : accept_hellos(s.listener, workers, advertise, timeout, "aggregator", give_back(0))) {
    if (j.hello.kind != PeerKind::worker) {
      throw Error(Errc::protocol, fmt::format("{}: only workers join an aggregator", j.conn.describe()));
    }
    MemberPeer peer{std::move(j.conn), j.hello.worker, true, {}};
    peer.partition = partitions_->partition_of(j.accepted);
    s.peers.push_back(std::move(peer));
  }
  first_late_advertised_ = partitions_->advertised();
  s.late.emplace(s.listener, advertise, s.options.transport.connect_timeout, "aggregator",
                 give_back(first_late_advertised_));
}

std::size_t SidecarMembers::take_doorbells(Aggregator::State& s) {
  std::size_t work = 0;
  for (MemberPeer& peer : s.peers) {
    if (!peer.alive) continue;
    try {
      // A worker sends nothing after its hello in sidecar mode but its bye: anything else is a
      // protocol error.
      if (auto bytes = peer.conn.try_receive()) {
        const Message message = decode(*bytes);
        if (!take_bye(message, peer.worker, peer.said_bye)) {
          throw Error(Errc::protocol, fmt::format("unexpected message (kind {}) at an aggregator in sidecar mode",
                                                  message.index() + 1));
        }
      }
      while (auto bell = peer.conn.try_doorbell()) {
        ++work;
        switch (book_->arrived(peer.partition, peer.worker, bell->imm, Clock::now())) {
          case Arrival::accepted:
            break;
          case Arrival::duplicate:
            ++s.stats.refused_doorbells;
            break;
          case Arrival::displaced:
            ++s.stats.displaced;
            break;
        }
      }
    } catch (const Error& e) {
      s.lose(peer, e);
      ++work;
    }
  }
  return work;
}

std::size_t SidecarMembers::take_grants(Aggregator::State& s) {
  std::size_t work = 0;
  while (const auto g = sidecar_.poll()) {
    ++work;
    if (g->kind == sidecar::GrantKind::aggregate) {
      // Members not here by hole_timeout after the slot (or after now, if later) are left out.
      const auto from = std::max(Clock::now(), Clock::time_point(g->slot_start));
      if (!book_->granted(g->request, g->sequence, g->part_count, g->slot_start, from + s.options.hole_timeout,
                          g->token)) {
        std::fprintf(stderr, "gradlane ps aggregator: a second grant for aggregate %llu ignored\n",
                     static_cast<unsigned long long>(g->request));
      }
      ++s.stats.granted;
    } else {
      std::fprintf(stderr, "gradlane ps aggregator: the sidecar answered %s (%s)\n",
                   std::string(sidecar::kind_name(g->kind)).c_str(),
                   std::string(sidecar::reason_name(g->reason)).c_str());
    }
  }
  return work;
}

void SidecarMembers::forward_aggregate(Aggregator::State& s, const DueAggregate& due) {
  const std::uint32_t came = static_cast<std::uint32_t>(due.members.size());
  s.stats.skipped += due.expected > came ? due.expected - came : 0;
  if (came == 0) {
    // Nothing to sum: the sidecar hears the forward failed and has the server skip the sequence.
    sidecar_.complete_aggregate(due.aggregate, std::chrono::nanoseconds{0}, /*failed=*/true);
    ++s.stats.cancelled;
    return;
  }
  std::vector<std::span<const float>> parts;
  parts.reserve(came);
  for (const BookedMember& m : due.members) parts.push_back(ring_->slot(book_->ring_slot(m)));
  sum_in_order(s.forward.gradient(), parts);
  const std::uint64_t forward_copied = s.forward.bytes_copied();
  wait_for_slot(due.slot_start);
  const PushResult pushed = s.write_forward(due.sequence, due.token);
  sidecar_.complete_aggregate(due.aggregate, pushed.wire_time, /*failed=*/pushed.lost);
  s.stats.bytes_copied += s.forward.bytes_copied() - forward_copied + (came == 1 ? ring_->slot_bytes() : 0);
  AggregatedUpdate update;
  update.tag = due.aggregate;
  update.sequence = pushed.lost ? 0 : due.sequence;
  update.lost = pushed.lost;
  for (const BookedMember& m : due.members) {
    update.members.push_back({m.worker, 0, 0});
    // m.peer is the member's partition of the ring: one per connection.
    const auto peer = std::find_if(s.peers.begin(), s.peers.end(),
                                   [&](const MemberPeer& p) { return p.alive && p.partition == m.peer; });
    if (peer != s.peers.end()) s.tell_forwarded(*peer, due.aggregate, pushed);
  }
  ++s.stats.forwarded;
  s.stats.summed += came;
  s.stats.short_groups += came < due.expected ? 1 : 0;
  s.stats.lost += pushed.lost ? 1 : 0;
  s.history.push_back(std::move(update));
}

std::size_t SidecarMembers::forward_due(Aggregator::State& s) {
  if (book_->empty()) return 0;
  const auto now = Clock::now();
  std::size_t work = 0;
  for (const DueAggregate& due : book_->take_due(now)) {
    forward_aggregate(s, due);
    ++work;
  }
  if (const std::size_t struck = book_->expire_ungranted(now, kUngrantedLimit); struck != 0) {
    std::fprintf(stderr, "gradlane ps aggregator: %zu members got no aggregate grant in %lld s: left out\n", struck,
                 static_cast<long long>(kUngrantedLimit.count()));
    s.stats.skipped += struck;
    work += struck;
  }
  return work;
}

std::size_t SidecarMembers::reclaim_partitions(Aggregator::State& s) {
  std::size_t work = 0;
  for (MemberPeer& peer : s.peers) {
    // Its connection is closed (lose()): nothing more lands in the partition. What landed is
    // summed or given up with its aggregate, which frees the slots.
    if (peer.alive || peer.partition_back || book_->holds_any(peer.partition)) continue;
    release_partition(*partitions_, *partition_windows_, peer.partition);
    peer.partition_back = true;
    ++work;
  }
  return work;
}

std::size_t SidecarMembers::progress(Aggregator::State& s) {
  if (!book_) throw Error(Errc::invalid_argument, "ps::Aggregator: accept_workers() first");
  std::size_t work = s.admit_joiners();
  work += s.probe_idle_members();
  work += take_doorbells(s);
  work += take_grants(s);
  work += forward_due(s);
  work += reclaim_partitions(s);
  return work;
}

bool SidecarMembers::finished(const Aggregator::State& s) const {
  // A restarted aggregator (accept_workers(0)) is not done before its first worker came back.
  const bool anyone = std::any_of(s.peers.begin(), s.peers.end(), [](const MemberPeer& p) { return p.alive; });
  return !s.peers.empty() && !anyone && (!book_ || book_->empty());
}

}  // namespace gradlane::ps
