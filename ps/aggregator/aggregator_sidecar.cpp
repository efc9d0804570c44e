// Aggregator in sidecar mode: the host's gradlaned forms the groups (include/gradlane/ps.hpp,
// "Aggregation (sidecar mode)"). Workers write redirected members into their own member slots
// here; the sidecar's aggregate grant says which server sequence their sum becomes. The
// AggregateBook pairs the two; when an aggregate is due, its members are summed in a fixed
// order straight into the forward Worker's registered buffer and written from there, in the
// granted slot, to the server and the replica.
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

void Aggregator::State::accept_sidecar_workers(std::size_t workers, Millis timeout) {
  if (book) throw Error(Errc::invalid_argument, "ps::Aggregator: in sidecar mode, accept_workers() once");
  const auto count = static_cast<std::uint32_t>(std::max<std::size_t>(workers, options.workers)) + kSparePartitions;
  ring.emplace(device, options.floats, count * slot_count, options.grant_windows, slot_count);
  book.emplace(count, slot_count);
  // Each connection gets its own partition of the ring: slot_count member slots, as it is
  // advertised to — at the start, and later (a worker back at a restarted aggregator, or after
  // its own restart) from the poll loop, which is why the lambda holds the pool, not this frame.
  const RegionDescriptor whole = ring->region().descriptor();
  const std::uint64_t partition_bytes = std::uint64_t{slot_count} * ring->slot_bytes();
  partitions = std::make_shared<PartitionPool>(count);
  partition_windows = std::make_shared<std::vector<std::optional<MemoryWindow>>>(count);
  const SlotRing* windowed = options.grant_windows ? &*ring : nullptr;  // the ring outlives the joins
  const auto advertise = [pool = partitions, windows = partition_windows, windowed, whole, partition_bytes,
                          dev = device, count](Connection& conn) {
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
  const auto give_back = [pool = partitions, windows = partition_windows](std::size_t first) {
    return [pool, windows, first](std::size_t accepted) {
      release_partition(*pool, *windows, pool->partition_of(first + accepted));
    };
  };
  for (Joined& j : accept_hellos(listener, workers, advertise, timeout, "aggregator", give_back(0))) {
    if (j.hello.kind != PeerKind::worker) {
      throw Error(Errc::protocol, fmt::format("{}: only workers join an aggregator", j.conn.describe()));
    }
    MemberPeer peer{std::move(j.conn), j.hello.worker, true, {}};
    peer.partition = partitions->partition_of(j.accepted);
    peers.push_back(std::move(peer));
  }
  first_late_advertised = partitions->advertised();
  late.emplace(listener, advertise, options.transport.connect_timeout, "aggregator", give_back(first_late_advertised));
}

std::size_t Aggregator::State::take_doorbells() {
  std::size_t work = 0;
  for (MemberPeer& peer : peers) {
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
        switch (book->arrived(peer.partition, peer.worker, bell->imm, Clock::now())) {
          case Arrival::accepted:
            break;
          case Arrival::duplicate:
            ++stats.refused_doorbells;
            break;
          case Arrival::displaced:
            ++stats.displaced;
            break;
        }
      }
    } catch (const Error& e) {
      lose(peer, e);
      ++work;
    }
  }
  return work;
}

std::size_t Aggregator::State::take_grants() {
  std::size_t work = 0;
  while (const auto g = sidecar->poll()) {
    ++work;
    if (g->kind == sidecar::GrantKind::aggregate) {
      // Members not here by hole_timeout after the slot (or after now, if later) are left out.
      const auto from = std::max(Clock::now(), Clock::time_point(g->slot_start));
      if (!book->granted(g->request, g->sequence, g->part_count, g->slot_start, from + options.hole_timeout,
                         g->token)) {
        std::fprintf(stderr, "gradlane ps aggregator: a second grant for aggregate %llu ignored\n",
                     static_cast<unsigned long long>(g->request));
      }
      ++stats.granted;
    } else {
      std::fprintf(stderr, "gradlane ps aggregator: the sidecar answered %s (%s)\n",
                   std::string(sidecar::kind_name(g->kind)).c_str(),
                   std::string(sidecar::reason_name(g->reason)).c_str());
    }
  }
  return work;
}

void Aggregator::State::forward_aggregate(const DueAggregate& due) {
  const std::uint32_t came = static_cast<std::uint32_t>(due.members.size());
  stats.skipped += due.expected > came ? due.expected - came : 0;
  if (came == 0) {
    // Nothing to sum: the sidecar hears the forward failed and has the server skip the sequence.
    sidecar->complete_aggregate(due.aggregate, std::chrono::nanoseconds{0}, /*failed=*/true);
    ++stats.cancelled;
    return;
  }
  std::vector<std::span<const float>> parts;
  parts.reserve(came);
  for (const BookedMember& m : due.members) parts.push_back(ring->slot(book->ring_slot(m)));
  sum_in_order(forward.gradient(), parts);
  const std::uint64_t forward_copied = forward.bytes_copied();
  wait_for_slot(due.slot_start);
  const PushResult pushed = write_forward(due.sequence, due.token);
  sidecar->complete_aggregate(due.aggregate, pushed.wire_time, /*failed=*/pushed.lost);
  stats.bytes_copied += forward.bytes_copied() - forward_copied + (came == 1 ? ring->slot_bytes() : 0);
  AggregatedUpdate update;
  update.tag = due.aggregate;
  update.sequence = pushed.lost ? 0 : due.sequence;
  update.lost = pushed.lost;
  for (const BookedMember& m : due.members) {
    update.members.push_back({m.worker, 0, 0});
    // m.peer is the member's partition of the ring: one per connection.
    const auto peer =
        std::find_if(peers.begin(), peers.end(), [&](const MemberPeer& p) { return p.alive && p.partition == m.peer; });
    if (peer != peers.end()) tell_forwarded(*peer, due.aggregate, pushed);
  }
  ++stats.forwarded;
  stats.summed += came;
  stats.short_groups += came < due.expected ? 1 : 0;
  stats.lost += pushed.lost ? 1 : 0;
  history.push_back(std::move(update));
}

std::size_t Aggregator::State::forward_due() {
  if (book->empty()) return 0;
  const auto now = Clock::now();
  std::size_t work = 0;
  for (const DueAggregate& due : book->take_due(now)) {
    forward_aggregate(due);
    ++work;
  }
  if (const std::size_t struck = book->expire_ungranted(now, kUngrantedLimit); struck != 0) {
    std::fprintf(stderr, "gradlane ps aggregator: %zu members got no aggregate grant in %lld s: left out\n", struck,
                 static_cast<long long>(kUngrantedLimit.count()));
    stats.skipped += struck;
    work += struck;
  }
  return work;
}

std::size_t Aggregator::State::reclaim_partitions() {
  std::size_t work = 0;
  for (MemberPeer& peer : peers) {
    // Its connection is closed (lose()): nothing more lands in the partition. What landed is
    // summed or given up with its aggregate, which frees the slots.
    if (peer.alive || peer.partition_back || book->holds_any(peer.partition)) continue;
    release_partition(*partitions, *partition_windows, peer.partition);
    peer.partition_back = true;
    ++work;
  }
  return work;
}

std::size_t Aggregator::State::progress_sidecar() {
  if (!book) throw Error(Errc::invalid_argument, "ps::Aggregator: accept_workers() first");
  std::size_t work = admit_joiners();
  work += probe_idle_members();
  work += take_doorbells();
  work += take_grants();
  work += forward_due();
  work += reclaim_partitions();
  return work;
}

bool Aggregator::State::finished_sidecar() const {
  // A restarted aggregator (accept_workers(0)) is not done before its first worker came back.
  const bool anyone = std::any_of(peers.begin(), peers.end(), [](const MemberPeer& p) { return p.alive; });
  return !peers.empty() && !anyone && (!book || book->empty());
}

}  // namespace gradlane::ps
