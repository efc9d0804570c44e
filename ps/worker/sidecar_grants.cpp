// SidecarGrants (sidecar_grants.hpp): a sidecar-mode worker's requests to its host's gradlaned
// and what it does with each answer.
#include "ps/worker/sidecar_grants.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "ps/protocol/slot_wait.hpp"
#include "ps/worker/worker_state.hpp"

namespace gradlane::ps {

SidecarGrants::SidecarGrants(const WorkerOptions& options, std::size_t bytes)
    : client_([&] {
        sidecar::AttachOptions attach = *options.sidecar;
        attach.region_bytes = bytes;
        return sidecar::Client::attach(attach);
      }()) {}

void SidecarGrants::ask(Worker::State& s) {
  request_ = client_.request({.tensor = s.options.tensor,
                              .receiver = s.options.server_endpoint,
                              .bytes = s.bytes,
                              .region_offset = 0,
                              .computed_on = s.push_computed_on,
                              .gradient_norm = 0.0F,
                              .priority = 0,
                              .job_remaining = s.job_remaining,
                              // No aggregator (none given, or lost): a redirect could only fail.
                              .direct_only = !s.aggregator.up()});
}

PushResult SidecarGrants::wait(Worker::State& s) {
  for (std::uint32_t expired = 0;;) {
    const sidecar::Grant g = client_.wait(s.options.timeout);
    if (g.request != request_) {
      throw Error(Errc::protocol,
                  fmt::format("the sidecar answered request {} while {} was in flight", g.request, request_));
    }
    const bool writes = g.kind == sidecar::GrantKind::go || g.kind == sidecar::GrantKind::redirect;
    if (!writes || !s.too_late(Clock::time_point(g.slot_start), expired)) {
      PushResult result = take_answer(s, g);
      result.expired_grants = expired;
      return result;
    }
    // Completed as failed, the sidecar cancels the sequence: the server skips it at once.
    client_.complete(g.request, g.part_index, std::chrono::nanoseconds{0}, /*failed=*/true);
    if (expired == Worker::State::kMaxGrantRequests) return Worker::State::expired_push(expired);
    s.send_request();
  }
}

PushResult SidecarGrants::from_the_future(Worker::State& s) {
  const auto now = Clock::now();
  const bool moving = s.failing_over();
  if (!future_since_) future_since_ = now;
  if (s.failovers != s.failovers_at_pull || moving || now - *future_since_ < s.options.failover_patience) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the takeover's moment
    return Worker::State::lost_push();
  }
  throw Error(Errc::protocol,
              fmt::format("the sidecar refused the push for {} ms: version_from_future (computed on version {}, "
                          "ahead of the server's sequence)",
                          std::chrono::duration_cast<Millis>(now - *future_since_).count(), s.push_computed_on));
}

PushResult SidecarGrants::take_answer(Worker::State& s, const sidecar::Grant& g) {
  if (g.reason == sidecar::Reason::receiver_of_another_job) {  // a drop from a peer, an error here
    throw Error(Errc::invalid_argument,
                fmt::format("the sidecar refused the push: endpoint {}'s server is an app of another job than this "
                            "worker's ({}): check the worker's server endpoint and job",
                            s.options.server_endpoint, s.options.sidecar ? s.options.sidecar->job : 0));
  }
  switch (g.kind) {
    case sidecar::GrantKind::go:
    case sidecar::GrantKind::redirect:
      refused_since_.reset();
      future_since_.reset();
      return write_granted(s, g);
    case sidecar::GrantKind::drop: {
      // Too stale to help (pull a fresh model) — or, with reason peer_lost, the receiver's
      // sidecar was lost, or with receiver_moved its server failed over before this was
      // decided: the model is not stale, the push simply did not happen.
      refused_since_.reset();
      // Refused by the receiver's sidecar elsewhere, as ours refuses it (an error below).
      if (g.reason == sidecar::Reason::version_from_future) return from_the_future(s);
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
        return Worker::State::lost_push();
      }
      // The server's sidecar is unreachable, or no sidecar serves it yet: during a failover,
      // until the promoted replica's sidecar announces it (a Takeover). Lost pushes for up to
      // failover_patience, then the error.
      if (g.reason == sidecar::Reason::receiver_unreachable || g.reason == sidecar::Reason::unknown_receiver) {
        const auto now = Clock::now();
        if (!refused_since_) refused_since_ = now;
        if (now - *refused_since_ < s.options.failover_patience) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the new owner needs a moment
          return Worker::State::lost_push();
        }
        throw Error(Errc::protocol,
                    fmt::format("the sidecar refused the push for {} ms: {} (endpoint {}); no sidecar took the "
                                "server over",
                                std::chrono::duration_cast<Millis>(now - *refused_since_).count(),
                                sidecar::reason_name(g.reason), s.options.server_endpoint));
      }
      if (g.reason == sidecar::Reason::version_from_future) return from_the_future(s);
      throw Error(Errc::protocol, fmt::format("the sidecar refused the push: {}", sidecar::reason_name(g.reason)));
    }
    default:
      throw Error(Errc::protocol, fmt::format("the sidecar answered the push with '{}', which a ps::Worker does not "
                                              "handle (an aggregate grant goes to a ps::Aggregator)",
                                              sidecar::kind_name(g.kind)));
  }
}

PushResult SidecarGrants::write_granted(Worker::State& s, const sidecar::Grant& g) {
  if (g.part_count != 1) {
    client_.complete(g.request, g.part_index, std::chrono::nanoseconds{0}, /*failed=*/true);
    throw Error(Errc::invalid_argument,
                fmt::format("the sidecar split the {}-byte update into {} parts: a shard must fit one part "
                            "(at most the sidecar's partition size); use more, smaller shards",
                            s.bytes, g.part_count));
  }
  const bool redirect = g.kind == sidecar::GrantKind::redirect;
  if (redirect && (!s.aggregator.up() || g.target != s.options.aggregator_endpoint)) {
    // Nowhere to write it: the sidecar hears it failed (the aggregate goes on without it).
    client_.complete(g.request, g.part_index, std::chrono::nanoseconds{0}, /*failed=*/true);
    if (!warned_redirect_) {
      std::fprintf(stderr,
                   "gradlane ps worker %u: the sidecar redirected an update to aggregator endpoint %u, %s; "
                   "reported lost\n",
                   s.options.id, g.target,
                   s.aggregator.up() ? "not the one this worker is connected to" : "and this worker has no aggregator");
      warned_redirect_ = true;
    }
    return Worker::State::lost_push();
  }
  PushResult result;
  try {
    // The server's slot is claimed, so the claims' round trips run while we wait for the slot.
    // With grant windows the claim shows the grant's token (to the replica too) and opens a
    // window; without them it carries none, and the server holds the sequence for us: it does
    // not skip it while our connection lives, so a write however late cannot land in a slot a
    // later sequence reuses. A sequence the server decided already is not written, but lost.
    const bool claims = !redirect;
    const bool mirror_claimed = claims && s.send_claims(g.sequence, g.token);
    wait_for_slot(g.slot_start);
    const Clock::time_point deadline = s.write_by(Clock::time_point(g.slot_start));
    // A member's slot at the aggregator is its aggregate id modulo the worker's slots there;
    // the doorbell carries the id's low 32 bits, the same modulo there.
    const auto id32 = static_cast<std::uint32_t>(g.sequence);
    result = redirect ? s.write_member(s.aggregator.slot_of(id32), id32)
             : claims ? s.write_claimed(g.sequence, deadline, g.token, mirror_claimed)
                      : s.write(g.sequence, deadline);
  } catch (const Error&) {
    client_.complete(g.request, g.part_index, std::chrono::nanoseconds{0}, /*failed=*/true);
    throw;
  }
  if (redirect) {
    result.aggregate = g.sequence;
    s.aggregator.took(g.sequence, s.push_tag);
  }
  // Not written (stalled past the grant before the server's write): failed, so the sidecar
  // cancels the sequence and the server skips it now if it has not yet.
  const bool unwritten = !redirect && result.lost && result.sequence == 0;
  client_.complete(g.request, g.part_index, result.wire_time, /*failed=*/unwritten);
  return result;
}

}  // namespace gradlane::ps
