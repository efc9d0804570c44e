// Worker::State, asking for a grant and taking the answer: from the server or the aggregator
// (direct mode) or from the host's sidecar, with the retries, refusals and drops of each.
#include "ps/worker/worker_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "common/back_off.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"
#include "ps/protocol/slot_wait.hpp"

namespace gradlane::ps {

void Worker::State::send_request() {
  requested_at = Clock::now();
  if (sidecar) {
    request = sidecar->request({.tensor = options.tensor,
                                .receiver = options.server_endpoint,
                                .bytes = bytes,
                                .region_offset = 0,
                                .computed_on = push_computed_on,
                                .gradient_norm = 0.0F,
                                .priority = 0,
                                .job_remaining = job_remaining,
                                // No aggregator (none given, or lost): a redirect could only fail.
                                .direct_only = !aggregator.up()});
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

PushResult Worker::State::wait_sidecar() {
  for (std::uint32_t expired = 0;;) {
    const sidecar::Grant g = sidecar->wait(options.timeout);
    if (g.request != request) {
      throw Error(Errc::protocol,
                  fmt::format("the sidecar answered request {} while {} was in flight", g.request, request));
    }
    const bool writes = g.kind == sidecar::GrantKind::go || g.kind == sidecar::GrantKind::redirect;
    if (!writes || !too_late(Clock::time_point(g.slot_start), expired)) {
      PushResult result = take_sidecar_answer(g);
      result.expired_grants = expired;
      return result;
    }
    // Completed as failed, the sidecar cancels the sequence: the server skips it at once.
    sidecar->complete(g.request, g.part_index, std::chrono::nanoseconds{0}, /*failed=*/true);
    if (expired == kMaxGrantRequests) return expired_push(expired);
    send_request();
  }
}

PushResult Worker::State::from_the_future() {
  const auto now = Clock::now();
  const bool moving = failing_over();
  if (!future_since) future_since = now;
  if (failovers != failovers_at_pull || moving || now - *future_since < options.failover_patience) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the takeover's moment
    return lost_push();
  }
  throw Error(Errc::protocol,
              fmt::format("the sidecar refused the push for {} ms: version_from_future (computed on version {}, "
                          "ahead of the server's sequence)",
                          std::chrono::duration_cast<Millis>(now - *future_since).count(), push_computed_on));
}

PushResult Worker::State::take_sidecar_answer(const sidecar::Grant& g) {
  if (g.reason == sidecar::Reason::receiver_of_another_job) {  // a drop from a peer, an error here
    throw Error(Errc::invalid_argument,
                fmt::format("the sidecar refused the push: endpoint {}'s server is an app of another job than this "
                            "worker's ({}): check the worker's server endpoint and job",
                            options.server_endpoint, options.sidecar ? options.sidecar->job : 0));
  }
  switch (g.kind) {
    case sidecar::GrantKind::go:
    case sidecar::GrantKind::redirect:
      refused_since.reset();
      future_since.reset();
      return write_granted(g);
    case sidecar::GrantKind::drop: {
      // Too stale to help (pull a fresh model) — or, with reason peer_lost, the receiver's
      // sidecar was lost, or with receiver_moved its server failed over before this was
      // decided: the model is not stale, the push simply did not happen.
      refused_since.reset();
      // Refused by the receiver's sidecar elsewhere, as ours refuses it (an error below).
      if (g.reason == sidecar::Reason::version_from_future) return from_the_future();
      PushResult dropped;
      const bool lost = g.reason == sidecar::Reason::peer_lost || g.reason == sidecar::Reason::receiver_moved ||
                        g.reason == sidecar::Reason::peer_refused;
      (lost ? dropped.lost : dropped.dropped) = true;
      return dropped;
    }
    case sidecar::GrantKind::error: {
      // The sidecar restarted (or stalled past its heartbeat) with this request owed: the
      // push never happened, as after a lost peer — the caller pulls and goes on.
      if (g.reason == sidecar::Reason::sidecar_restarted) {
        return lost_push();
      }
      // The server's sidecar is unreachable, or no sidecar serves it yet: during a failover,
      // until the promoted replica's sidecar announces it (a Takeover). Lost pushes for up to
      // failover_patience, then the error.
      if (g.reason == sidecar::Reason::receiver_unreachable || g.reason == sidecar::Reason::unknown_receiver) {
        const auto now = Clock::now();
        if (!refused_since) refused_since = now;
        if (now - *refused_since < options.failover_patience) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the new owner needs a moment
          return lost_push();
        }
        throw Error(Errc::protocol,
                    fmt::format("the sidecar refused the push for {} ms: {} (endpoint {}); no sidecar took the "
                                "server over",
                                std::chrono::duration_cast<Millis>(now - *refused_since).count(),
                                sidecar::reason_name(g.reason), options.server_endpoint));
      }
      if (g.reason == sidecar::Reason::version_from_future) return from_the_future();
      throw Error(Errc::protocol, fmt::format("the sidecar refused the push: {}", sidecar::reason_name(g.reason)));
    }
    default:
      throw Error(Errc::protocol, fmt::format("the sidecar answered the push with '{}', which a ps::Worker does not "
                                              "handle (an aggregate grant goes to a ps::Aggregator)",
                                              sidecar::kind_name(g.kind)));
  }
}

}  // namespace gradlane::ps
