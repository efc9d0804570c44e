// A ShardServer applying updates (shard_server.cpp): each arrived sequence in order, in chunks
// between which the network is served, published to pulls through the shard's seqlock.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <utility>

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

// Floats applied between two looks at the network: 256 KiB, ~6 µs natively. A 4 MiB apply
// done in one piece kept the next request waiting a whole apply (perf/results/ps-push.md).
constexpr std::size_t kApplyChunkFloats = std::size_t{1} << 16;

void ShardServer::State::between_chunks() {
  // Direct mode: take requests and doorbells and grant free slots while the apply runs. The
  // slot being applied stays busy in `order` until done(), so nothing can be granted into it.
  // Sidecar mode with grant windows: answer claims (a claim waited a whole 4 MiB apply, 12 ms,
  // before: perf/results/grant-windows/sidecar-4MiB).
  if (role == Role::server && (!sidecar || windowed())) take_input();
  if (role == Role::server && !sidecar) grant();
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
    std::int64_t apply_start = 0;
    if (skip) {
      writer.skip();
    } else {
      apply_start = monotonic_ns();
      apply_update(step->slot);
    }
    (void)order.done(*step);
    close_claim(step->sequence);  // a replica's mirror claim whose mirror never came (read from the server)
    AppliedUpdate record{step->sequence, 0, 0, 0, skip};
    if (const auto decided = following.take_fed(step->sequence)) {  // as the server decided it
      if (!skip) {
        record.worker = decided->worker;
        record.tag = decided->tag;
        note_landed(record.worker, Landed{record.tag, record.sequence, 0});
      }
    } else if (role == Role::server && options.sidecar) {  // attached or not (taking a sequence over)
      const auto from = rung_by.extract(step->sequence);
      const auto said = pushed.extract(step->sequence);
      if (!from.empty() && !skip) {
        record.worker = from.mapped();
        if (!said.empty()) {  // the push's own tag and version (Pushing)
          record.tag = said.mapped().tag;
          record.computed_on = said.mapped().computed_on;
        } else {
          record.tag = arrivals[record.worker]++;  // an aggregator's forward: its n-th update
        }
      }
    } else if (role == Role::server) {
      const auto info = granted.extract(step->sequence);
      if (!info.empty() && !skip) {
        record.worker = info.mapped().worker;
        record.tag = info.mapped().tag;
        record.computed_on = info.mapped().computed_on;
      }
    }
    if (!skip) record.doorbell_ns = std::exchange(doorbell_ns[step->slot], 0);
    record.apply_start_ns = apply_start;
    record.apply_end_ns = monotonic_ns();
    if (clocks && !skip && clocks->applied(record.worker, record.tag)) {
      shard.header().slowest_clock.store(clocks->slowest(), std::memory_order_release);
    }
    if (role == Role::server) tell_replica(record);
    ++(skip ? stats.skipped : stats.applied);
    history.push_back(record);
    ++work;
  }
  if (role == Role::replica && primary && peers[*primary].alive) {
    if (const auto through = following.ack_due(order.next_sequence() - 1)) {
      try {
        peers[*primary].conn.send(encode(Ack{*through}));
      } catch (const Error& e) {
        lose(peers[*primary], e);
      }
    }
  }
  return work;
}

}  // namespace gradlane::ps
