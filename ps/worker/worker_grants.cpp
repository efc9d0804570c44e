// Worker::State, asking for a grant and taking the answer: from the server or the aggregator
// (direct mode), with its retries and refusals; in sidecar mode SidecarGrants asks.
#include "ps/worker/worker_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "common/back_off.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::ps {

void Worker::State::send_request() {
  requested_at = Clock::now();
  if (sidecar) {
    sidecar->ask(*this);
  } else {
    push_target().send(encode(Request{options.id, push_tag, push_computed_on}));
  }
}

bool Worker::State::too_late(Clock::time_point since, std::uint32_t& expired) {
  if (Clock::now() <= write_by(since)) return false;
  ++expired;
  std::fprintf(stderr,
               "gradlane ps worker %u: a grant came %lld ms after %s (grant_lifetime %lld ms): not "
               "written, %s\n",
               options.id, static_cast<long long>(std::chrono::duration_cast<Millis>(Clock::now() - since).count()),
               sidecar ? "its slot's start" : "it arrived", static_cast<long long>(options.grant_lifetime.count()),
               expired < kMaxGrantRequests ? "asking again" : "the push is reported lost");
  return true;
}

std::pair<Message, Clock::time_point> Worker::State::receive_noting_arrival(Connection& target) {
  const auto start = Clock::now();
  Clock::time_point last_empty = requested_at, last_probe = start;
  for (;;) {
    if (auto message = target.try_receive()) return {decode(*message), last_empty};
    last_empty = Clock::now();
    const auto waited = last_empty - start;
    if (waited > options.timeout) {
      throw Error(Errc::timeout, fmt::format("{}: no grant within {} ms", target.describe(), options.timeout.count()));
    }
    // Waiting for a message, the connection is idle: a peer gone without a disconnect reaching
    // us (its host or process died while the link was down, so its DREQ was lost) would go
    // unnoticed until the timeout (120 s in the link:2 fault). A probe a second fails within
    // the ACK timeout and its retries instead; try_receive() then throws it (failover).
    if (last_empty - last_probe >= std::chrono::seconds(1) && target.outstanding() == 0) {
      last_probe = last_empty;
      target.probe();
    }
    // A grant behind a slow server can take seconds, and the worker shares the host's cores:
    // past the spin it sleeps until the connection has something (32 workers napping 1 ms
    // took the cores their server needed: perf/results/sidecar-load.md).
    if (waited >= detail::kSpinFor) {
      // At least 1 ms: while a probe is still outstanding, last_probe stands still and the
      // time to the next one is past (a wait of 0 would spin).
      const auto until_probe = last_probe + std::chrono::seconds(1) - last_empty;
      const auto sleep = std::chrono::ceil<Millis>(std::min<Clock::duration>(options.timeout - waited, until_probe));
      target.wait_for_activity(std::max(sleep, Millis(1)));
    }
  }
}

PushResult Worker::State::wait_direct() {
  for (std::uint32_t expired = 0;;) {
    Connection& target = push_target();
    const auto [answer, arrived_after] = receive_noting_arrival(target);
    if (const auto* forwarded = std::get_if<Forwarded>(&answer); forwarded != nullptr && aggregator.up()) {
      aggregator.take_forwarded(*forwarded);  // an earlier member's outcome, ahead of this grant
      continue;
    }
    if (const auto* at = std::get_if<ListeningAt>(&answer); at != nullptr && &target == &server) {
      take_listening_at(*at);
      continue;
    }
    if (std::holds_alternative<Opened>(answer)) continue;  // a mirror claim's answer from before a failover
    if (const auto* refused = std::get_if<Refused>(&answer)) return refused_push(target, *refused);
    const auto* grant = std::get_if<Grant>(&answer);
    if (grant == nullptr || grant->sequence == 0) {
      throw Error(Errc::protocol,
                  fmt::format("{}: expected a grant, got message kind {}", target.describe(), answer.index() + 1));
    }
    // Not written, an expired grant is a hole the server skips after its hole_timeout.
    if (!too_late(arrived_after, expired)) {
      const bool mirror_claimed = claim_mirror(grant->sequence, grant->token);
      PushResult result =
          write(grant->sequence, write_by(arrived_after), grant->window_rkey, grant->token, mirror_claimed);
      result.expired_grants = expired;
      return result;
    }
    if (expired == kMaxGrantRequests) return expired_push(expired);
    send_request();
  }
}

PushResult Worker::State::lost_push() {
  PushResult lost;
  lost.lost = true;
  return lost;
}

PushResult Worker::State::refused_push(const Connection& target, const Refused& refused) {
  if (refused.why == RefusedWhy::not_the_server) {
    throw Error(Errc::invalid_argument,
                fmt::format("{}: refused push tag {}: this is the shard's replica, and its server lives; give "
                            "WorkerOptions::server the server's address (the replica's goes in ::replica)",
                            target.describe(), refused.tag));
  }
  if (refused.why == RefusedWhy::round_closed) {
    PushResult dropped;
    dropped.dropped = true;
    return dropped;
  }
  if (failovers != failovers_at_pull || failing_over()) return lost_push();
  throw Error(Errc::invalid_argument,
              fmt::format("{}: the server refused push tag {}: computed on version {}, and it has granted only up to "
                          "{}; push a gradient of a model pulled from this shard's server (pull() says its version)",
                          target.describe(), refused.tag, push_computed_on, refused.version));
}

PushResult Worker::State::expired_push(std::uint32_t expired) {
  PushResult lost = lost_push();
  lost.expired_grants = expired;
  return lost;
}

}  // namespace gradlane::ps
