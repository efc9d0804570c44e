// DistributedPolicy's takeovers: a receiver's sequence moving to a peer (a replica promoted
// there, a server that outlived its sidecar), fenced by an epoch that only grows.
#include "sidecar/peer/distributed_policy.hpp"

#include <fmt/format.h>

namespace gradlane::peer {

void DistributedPolicy::learn(const TakeoverMark& mark) {
  TakeoverMark& known = takeovers_[mark.endpoint];
  if (mark.epoch > known.epoch) known = mark;
}

// A takeover moves a receiver's sequence for good: only one past every epoch known here, and
// not while a server attached here serves the receiver (of another job, or alive).
std::optional<DistributedPolicy::TakeoverRefusal> DistributedPolicy::refuse_takeover(const Takeover& m) const {
  const sched::EndpointId receiver{m.endpoint};
  if (const auto known = takeovers_.find(m.endpoint); known != takeovers_.end()) {
    if (m.epoch <= known->second.epoch) {
      return TakeoverRefusal{fmt::format("epoch {} is not past {}, the latest known here: a stale or repeated takeover",
                                         m.epoch, known->second.epoch)};
    }
  }
  if (const auto served = scheduler_.served_job(receiver)) {
    if (sched::to_int(*served) != m.job) {
      return TakeoverRefusal{fmt::format("its server here is an app of job {}", sched::to_int(*served))};
    }
    if (is_local(receiver) && (!server_alive_ || server_alive_(receiver))) {
      return TakeoverRefusal{"its server here is alive: the sequence stays with it", true};
    }
  }
  return std::nullopt;
}

void DistributedPolicy::on_takeover(PeerIndex peer, const Takeover& m, sched::Instant now) {
  const auto refusal = refuse_takeover(m);
  if (!refusal) {
    held_takeovers_.erase(m.endpoint);
    take_peer_takeover(peer, m);
    return;
  }
  if (refusal->server_alive) {
    const auto held = held_takeovers_.find(m.endpoint);
    if (held == held_takeovers_.end() || held->second.takeover.epoch < m.epoch) {
      held_takeovers_[m.endpoint] = HeldTakeover{peer, m, now + kTakeoverHold};
      ++stats_.takeovers_held;
      note(
          fmt::format("holding peer {}'s takeover of endpoint {} at version {} (epoch {}, job {}) for up to {} ms: "
                      "{}; taken if it exits",
                      transport_.describe(peer), m.endpoint, m.version, m.epoch, m.job,
                      std::chrono::duration_cast<std::chrono::milliseconds>(kTakeoverHold).count(), refusal->why));
    }
    return;
  }
  refuse_peer_takeover(peer, m, refusal->why);
}

void DistributedPolicy::refuse_peer_takeover(PeerIndex peer, const Takeover& m, std::string_view why) {
  ++stats_.takeovers_refused;
  note(fmt::format("refused peer {}'s takeover of endpoint {} at version {} (epoch {}, job {}): {}",
                   transport_.describe(peer), m.endpoint, m.version, m.epoch, m.job, why));
}

void DistributedPolicy::settle_held_takeovers(sched::Instant now) {
  for (auto it = held_takeovers_.begin(); it != held_takeovers_.end();) {
    const auto& [peer, m, until] = it->second;
    const auto refusal = refuse_takeover(m);
    if (refusal && refusal->server_alive && now < until) {
      ++it;
      continue;
    }
    if (!refusal) {
      take_peer_takeover(peer, m);
    } else {
      refuse_peer_takeover(peer, m, refusal->why + (refusal->server_alive ? " (still, after holding it)" : ""));
    }
    it = held_takeovers_.erase(it);
  }
}

void DistributedPolicy::take_peer_takeover(PeerIndex peer, const Takeover& m) {
  learn(TakeoverMark{m.endpoint, m.epoch, m.job});
  const sched::EndpointId receiver{m.endpoint};
  if (is_local(receiver)) {
    // Its server failed over to a replica there: what we had pending for it is dropped
    // (receiver_moved, routed by the next schedule()); its sequence is no longer ours.
    const std::size_t before = moved_.size();
    const std::size_t aggregates = scheduler_.close_receiver(receiver, moved_);
    local_.erase(m.endpoint);
    grant_keys_.erase(m.endpoint);  // its new owner stamps its grants
    note(
        fmt::format("peer {} took over endpoint {} at version {} (epoch {}): {} pending part(s) dropped, {} "
                    "pending aggregate(s) forgotten",
                    transport_.describe(peer), m.endpoint, m.version, m.epoch, moved_.size() - before, aggregates));
  } else {
    note(fmt::format("peer {} took over endpoint {} at version {} (epoch {})", transport_.describe(peer), m.endpoint,
                     m.version, m.epoch));
  }
  endpoint_owner_[m.endpoint] = peer;
}

bool DistributedPolicy::take_over(sched::EndpointId receiver, sched::Version version, sched::JobId job,
                                  sched::Instant now) {
  last_now_ = std::max(last_now_, now);
  const std::uint32_t e = sched::to_int(receiver);
  const std::uint64_t latest = takeovers_.contains(e) ? takeovers_.at(e).epoch : 0;
  scheduler_.close_receiver(receiver, moved_);  // ours already (the replica shares the server's host)
  if (!scheduler_.open_receiver(receiver, version)) return false;
  const TakeoverMark ours{e, latest + 1, sched::to_int(job)};
  takeovers_[e] = ours;
  held_takeovers_.erase(e);  // a peer's, older than ours
  local_.insert(e);
  endpoint_owner_.erase(e);
  // Our requests a peer was scheduling for it stay forwarded: that peer drops them
  // (receiver_moved) when our Takeover reaches it, or lose_peer() does if it is gone.
  for (PeerIndex p = 0; p < transport_.peer_count(); ++p) send(p, Takeover{e, version, ours.epoch, ours.job});
  note(
      fmt::format("took over endpoint {} at version {}, epoch {} (its replica here was promoted, or its server "
                  "here outlived the sidecar before us)",
                  e, version, ours.epoch));
  return true;
}

}  // namespace gradlane::peer
