// A ShardServer in sidecar mode (shard_server.cpp): the sidecar's cancels, a granted head that
// never arrives, and reporting what both server and replica applied, which frees their slots.
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

namespace {
// How many hole timeouts a head held by a claim without windows waits for its write before the
// claimant is dropped (skip_stuck_head).
constexpr int kClaimHeldTimeouts = 10;
}  // namespace

std::size_t ShardServer::State::take_sidecar() {
  std::size_t work = 0;
  while (auto g = sidecar->poll()) {
    ++work;
    if (g->kind == sidecar::GrantKind::cancel) {
      // Its sender's sidecar was lost, not (known) the sender: a sequence it claimed without
      // windows is held for it as a claimed head is (skip_stuck_head) — skipped now, its write,
      // still coming, would land in a slot a later sequence reuses and be acknowledged to it.
      if (g->reason == sidecar::Reason::peer_lost && !windowed() && claimed.contains(g->sequence)) {
        ++stats.held_cancels;
        continue;
      }
      if (cancel(g->sequence) != Admit::accepted) ++stats.refused_cancels;
    } else {
      std::fprintf(stderr, "gradlane ps server: the sidecar answered: %s (%s)\n",
                   std::string(sidecar::kind_name(g->kind)).c_str(),
                   std::string(sidecar::reason_name(g->reason)).c_str());
    }
  }
  return work;
}

// Sidecar mode: a worker that took its grant and stalls without dying never gets cancelled by
// the sidecar. Sequences are granted in order, so once a later one has arrived the head was
// granted too: give it hole_timeout, then skip it. A head held by a claim without windows
// (answer_claim) is not skipped while its claimant's connection lives: its write may come at
// any moment. Past kClaimHeldTimeouts hole timeouts the claimant is dropped — its connection
// closed, nothing of it lands any more — and its claims are skipped.
std::size_t ShardServer::State::skip_stuck_head() {
  if (order.next() || order.pending() == 0) {
    gap_since.reset();
    return 0;
  }
  const auto now = Clock::now();
  if (!gap_since) gap_since = now;
  if (now - *gap_since < options.hole_timeout) return 0;
  if (const auto held = claimed.find(order.next_sequence()); held != claimed.end() && !windowed()) {
    // Held while its claimant lives: lose() cancels a lost claimant's claims.
    Peer& claimant = peers[held->second];
    const auto hold_for = options.hole_timeout * kClaimHeldTimeouts;
    if (now - *gap_since < hold_for) return 0;
    // The replica first, on the connection our skip follows on: there too its mirror must not
    // land once the slot can be reused, which is only after the replica followed the skip.
    send_to_replica(Dropped{claimant.worker});
    lose(claimant, Error(Errc::timeout, fmt::format("it claimed sequence {} and wrote nothing in {} ms: dropped, so "
                                                    "that nothing it writes can land in a reused slot",
                                                    held->first, hold_for.count())));
    gap_since.reset();
    return 1;
  }
  std::fprintf(stderr, "gradlane ps server: sequence %llu did not arrive in %lld ms while later ones did: skipped\n",
               static_cast<unsigned long long>(order.next_sequence()),
               static_cast<long long>(options.hole_timeout.count()));
  cancel(order.next_sequence());
  gap_since.reset();
  return 1;
}

// Sidecar mode: what both the server and the replica have applied frees their slots.
void ShardServer::State::report_applied() {
  std::uint64_t through = order.next_sequence() - 1;
  if (replica) through = std::min(through, stats.replica_acked);
  if (through <= reported) return;
  sidecar->applied(through);
  reported = through;
}

}  // namespace gradlane::ps
