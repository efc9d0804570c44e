#include "sidecar/peer/distributed_policy.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <variant>

#include "common/overloaded.hpp"
#include "gradlane/sidecar.hpp"

namespace gradlane::peer {
namespace {

// Ids this policy makes up live above 2^62, far from the daemon's request ids and the
// scheduler's transfer ids (both count up from 1), so the two can never collide.
constexpr std::uint64_t kOwnIdBase = std::uint64_t{1} << 62;
// With peers, messages arrive over RDMA without ringing the daemon's doorbell, so the loop
// must look at the links this often even when idle: 100 µs bounds the answer latency a
// sleeping daemon adds, at ~10k cheap polls per second.
constexpr sched::Nanos kPeerPollInterval{100'000};
// With every peer lost there are no messages to answer, only links coming back to take.
constexpr sched::Nanos kLostPeersPollInterval{5'000'000};

// A drop's reason on the wire and back. A staleness drop is the default on both sides.
DropCause drop_cause(sched::DropReason reason) {
  switch (reason) {
    case sched::DropReason::receiver_moved:
      return DropCause::receiver_moved;
    case sched::DropReason::receiver_of_another_job:
      return DropCause::receiver_of_another_job;
    case sched::DropReason::peer_refused:
      return DropCause::refused;
    case sched::DropReason::version_from_future:
      return DropCause::version_from_future;
    case sched::DropReason::staleness_bound:
    case sched::DropReason::peer_lost:
      break;
  }
  return DropCause::stale;
}

sched::DropReason drop_reason(DropCause cause) {
  switch (cause) {
    case DropCause::receiver_moved:
      return sched::DropReason::receiver_moved;
    case DropCause::receiver_of_another_job:
      return sched::DropReason::receiver_of_another_job;
    case DropCause::refused:
      return sched::DropReason::peer_refused;
    case DropCause::version_from_future:
      return sched::DropReason::version_from_future;
    case DropCause::stale:
      break;
  }
  return sched::DropReason::staleness_bound;
}

SlotAnswer drop_answer(std::uint64_t request, std::uint32_t part, std::uint32_t part_count, std::uint64_t offset,
                       std::uint64_t length, std::uint64_t delay, DropCause cause = DropCause::stale) {
  SlotAnswer a;
  a.kind = AnswerKind::drop;
  a.drop_cause = cause;
  a.request = request;
  a.part = part;
  a.part_count = part_count;
  a.offset = offset;
  a.length = length;
  a.delay = delay;
  return a;
}

}  // namespace

DistributedPolicy::DistributedPolicy(sched::SchedulerConfig config, std::vector<std::uint32_t> local_endpoints,
                                     PeerTransport& transport, Log log)
    : scheduler_(config),
      local_(local_endpoints.begin(), local_endpoints.end()),
      transport_(transport),
      log_(std::move(log)) {}

void DistributedPolicy::start() {
  const Hello ours = hello();
  for (PeerIndex p = 0; p < transport_.peer_count(); ++p) send(p, ours);
}

Hello DistributedPolicy::hello() const {
  Hello h{{local_.begin(), local_.end()}, {}};
  for (const auto& [endpoint, mark] : takeovers_) {
    if (h.takeovers.size() == kMaxTakeoverMarks) break;
    h.takeovers.push_back(mark);
  }
  return h;
}

void DistributedPolicy::admit_joined() {
  // A peer sidecar that connected after start-up (one restarted): introduce ourselves; its
  // Hello takes over the endpoints its previous, lost, link announced.
  for (PeerIndex p : transport_.take_joined()) {
    note(fmt::format("peer {} joined", transport_.describe(p)));
    send(p, hello());
  }
}

bool DistributedPolicy::ready() const { return greeted_.size() + lost_.size() >= transport_.peer_count(); }

bool DistributedPolicy::send(PeerIndex peer, const Message& message) {
  if (lost_.contains(peer)) return false;
  const auto bytes = encode(message);
  return transport_.send(peer, bytes);
}

std::optional<PeerIndex> DistributedPolicy::owner_of(sched::EndpointId endpoint) const {
  const auto it = endpoint_owner_.find(sched::to_int(endpoint));
  if (it == endpoint_owner_.end() || lost_.contains(it->second)) return std::nullopt;
  return it->second;
}

sched::SubmitStatus DistributedPolicy::submit(const sched::Request& request, sched::Instant now) {
  const sched::SubmitStatus status = submit_here_or_forward(request, now);
  if (request_hook_ && status == sched::SubmitStatus::accepted) request_hook_(request, now);
  return status;
}

sched::SubmitStatus DistributedPolicy::submit_here_or_forward(const sched::Request& request, sched::Instant now) {
  if (schedules_here(request.receiver)) return scheduler_.submit(request, now);
  const auto owner = endpoint_owner_.find(sched::to_int(request.receiver));
  if (owner == endpoint_owner_.end()) return sched::SubmitStatus::unknown_receiver;  // nobody announced it
  // Its owner's sequence stays its owner's, even while we cannot reach it (see the header).
  if (lost_.contains(owner->second)) return sched::SubmitStatus::receiver_unreachable;
  const PeerIndex peer = owner->second;
  // The receiver's sidecar decides; what can be refused here is refused here.
  if (request.bytes == 0) return sched::SubmitStatus::empty_request;
  if (request.sender == request.receiver) return sched::SubmitStatus::sender_is_receiver;
  const auto id = static_cast<std::uint64_t>(request.id);
  if (forwarded_.contains(id)) return sched::SubmitStatus::duplicate_id;
  forwarded_.add(id, peer, request);
  ++stats_.forwarded;
  send(peer, SlotRequest{id, sched::to_int(request.job), sched::to_int(request.sender), sched::to_int(request.receiver),
                         sched::to_int(request.tensor), request.bytes, request.computed_on, request.gradient_norm,
                         request.priority, request.job_remaining, request.direct_only});
  return sched::SubmitStatus::accepted;
}

void DistributedPolicy::schedule(sched::Instant now, std::vector<sched::Outcome>& out) {
  last_now_ = std::max(last_now_, now);
  const std::size_t first_from_peers = out.size();
  for (PeerIndex p : transport_.take_failed()) lose_peer(p, now, out);
  admit_joined();
  pump(now, out);
  settle_held_takeovers(now);
  if (decision_hook_) {
    for (std::size_t i = first_from_peers; i < out.size(); ++i) decision_hook_(out[i], now, "peer");
  }
  decided_.clear();
  decided_.swap(moved_);  // drops of a receiver that moved away, then what the core decides now
  scheduler_.schedule(now, decided_);
  for (const sched::Outcome& outcome : decided_) {
    if (decision_hook_) decision_hook_(outcome, now, "here");
    // Outcomes for our own applications go to the daemon; those for a peer's go back to it.
    const bool local =
        std::visit(detail::Overloaded{
                       [&](const sched::AggregateGrant& a) { return is_local(a.aggregator); },
                       // This sidecar owns the receiver's sequence, so its server app is here.
                       [&](const sched::Cancel&) { return true; },
                       [&](const auto& part) { return !remote_.contains(static_cast<std::uint64_t>(part.request)); }},
                   outcome);
    if (local) {
      out.push_back(outcome);
    } else {
      answer_remote(outcome, now);
    }
  }
}

void DistributedPolicy::pump(sched::Instant now, std::vector<sched::Outcome>& out) {
  while (auto received = transport_.receive()) {
    auto& [peer, bytes] = *received;
    try {
      on_message(peer, decode(bytes), now, out);
    } catch (const Error& e) {
      // A malformed message costs that message, not the daemon or the link.
      ++stats_.protocol_errors;
      note(fmt::format("peer {}: {} (message dropped)", transport_.describe(peer), e.what()));
    }
  }
  for (PeerIndex p : transport_.take_failed()) lose_peer(p, now, out);
}

void DistributedPolicy::on_message(PeerIndex peer, const Message& message, sched::Instant now,
                                   std::vector<sched::Outcome>& out) {
  std::visit(detail::Overloaded{
                 [&](const Hello& hello) {
                   for (auto e : hello.endpoints) {
                     if (local_.contains(e)) {
                       throw Error(Errc::protocol, fmt::format("peer claims endpoint {}, which is ours", e));
                     }
                     // A peer coming back may claim what its lost link announced, never what a live one does.
                     const auto owner = endpoint_owner_.find(e);
                     if (owner != endpoint_owner_.end() && owner->second != peer && !lost_.contains(owner->second)) {
                       throw Error(Errc::protocol, fmt::format("peer claims endpoint {}, which peer {} serves", e,
                                                               transport_.describe(owner->second)));
                     }
                   }
                   for (auto e : hello.endpoints) endpoint_owner_[e] = peer;
                   for (const TakeoverMark& mark : hello.takeovers) learn(mark);
                   greeted_.insert(peer);
                   note(fmt::format("peer {} hosts {} endpoint(s)", transport_.describe(peer), hello.endpoints.size()));
                 },
                 [&](const SlotRequest& m) {
                   // A refusal goes back as a drop naming its cause, and into our schedule log too.
                   const auto refuse = [&](DropCause cause) {
                     send(peer, drop_answer(m.request, 0, 1, 0, m.bytes, 0, cause));
                     ++stats_.answers_sent;
                     if (decision_hook_) {
                       decision_hook_(sched::Drop{.request = sched::RequestId{m.request},
                                                  .length = m.bytes,
                                                  .job = sched::JobId{m.job},
                                                  .sender = sched::EndpointId{m.sender},
                                                  .receiver = sched::EndpointId{m.receiver},
                                                  .reason = drop_reason(cause)},
                                      now, "refused");
                     }
                   };
                   if (!is_local(sched::EndpointId{m.receiver}) && endpoint_owner_.contains(m.receiver)) {
                     // It moved away (a Takeover) and the peer has not heard yet: it asks again there.
                     return refuse(DropCause::receiver_moved);
                   }
                   if (!is_local(sched::EndpointId{m.receiver})) {
                     throw Error(Errc::protocol,
                                 fmt::format("slot request for endpoint {}, which is not on this host", m.receiver));
                   }
                   if (!remote_.admits(peer, m.bytes)) {
                     if (stats_.remote_refused++ == 0) {
                       note(fmt::format("peer {} {}", transport_.describe(peer), remote_.refusal(peer, m.bytes)));
                     }
                     return refuse(DropCause::refused);
                   }
                   const std::uint64_t ours = kOwnIdBase | next_remote_++;
                   sched::Request request{sched::RequestId{ours},
                                          sched::JobId{m.job},
                                          sched::EndpointId{m.sender},
                                          sched::EndpointId{m.receiver},
                                          sched::TensorId{m.tensor},
                                          m.bytes,
                                          m.computed_on,
                                          m.gradient_norm,
                                          m.priority,
                                          m.job_remaining,
                                          m.direct_only};
                   const auto status = scheduler_.submit(request, now);
                   if (status != sched::SubmitStatus::accepted) {
                     // The refusals a well-formed request can meet here: a version from the future
                     // (a model pulled before a failover from a server that got further), or a
                     // receiver whose server serves another job.
                     return refuse(status == sched::SubmitStatus::receiver_of_another_job
                                       ? DropCause::receiver_of_another_job
                                   : status == sched::SubmitStatus::version_from_future ? DropCause::version_from_future
                                                                                        : DropCause::stale);
                   }
                   remote_.add(ours, RemoteRequests::Request{peer, m.request, m.bytes});
                   ++stats_.remote_requests;
                 },
                 [&](const SlotAnswer& m) { on_answer(peer, m, now, out); },
                 [&](const Takeover& m) { on_takeover(peer, m, now); },
                 [&](const TransferDone& m) {
                   const auto it = granted_to_peer_.find(m.transfer);
                   if (it == granted_to_peer_.end() || it->second != peer) {
                     throw Error(Errc::protocol,
                                 fmt::format("transfer done for transfer {}, not granted to this peer", m.transfer));
                   }
                   granted_to_peer_.erase(it);
                   finish(sched::TransferId{m.transfer}, now, sched::Nanos{m.measured_ns},
                          m.failed ? sched::TransferResult::failed : sched::TransferResult::ok);
                 },
             },
             message);
}

sched::Slot DistributedPolicy::book_egress(sched::EndpointId sender, sched::Slot slot) {
  sched::SlotBook& egress = egress_[sched::to_int(sender)];
  egress.retire_before(last_now_);
  if (egress.reserve(slot)) return slot;
  ++stats_.egress_moves;  // another receiver's slot holds our NIC then: go right after it
  return egress.grant(slot.start, slot.length());
}

void DistributedPolicy::on_answer(PeerIndex peer, const SlotAnswer& m, sched::Instant now,
                                  std::vector<sched::Outcome>& out) {
  ++stats_.answers_received;
  const sched::Instant start = now + sched::Nanos{m.start_in_ns};
  sched::Slot slot{start, start + sched::Nanos{m.length_ns}};
  auto proxy = [&] {
    const std::uint64_t id = kOwnIdBase | next_proxy_++;
    proxies_[id] = ProxyTransfer{peer, m.transfer};
    return sched::TransferId{id};
  };
  if (m.kind == AnswerKind::aggregate) {
    if (!is_local(sched::EndpointId{m.sender})) {
      throw Error(Errc::protocol, fmt::format("aggregate grant for aggregator {}, not on this host", m.sender));
    }
    sched::AggregateGrant a;
    a.transfer = proxy();
    a.aggregate = sched::AggregateId{m.request};
    a.offset = m.offset;
    a.length = m.length;
    a.aggregator = sched::EndpointId{m.sender};
    a.receiver = sched::EndpointId{m.target};
    for (auto id : m.members) a.members.push_back(sched::PartRef{sched::RequestId{id}, 0});
    a.slot = book_egress(a.aggregator, slot);
    a.seq = m.seq;
    a.delay = m.delay;
    a.token = m.token;
    out.push_back(std::move(a));
    return;
  }
  const sched::Request r = forwarded_.decide(peer, m);
  switch (m.kind) {
    case AnswerKind::go:
      out.push_back(sched::Grant{proxy(), r.id, m.part, m.part_count, m.offset, m.length, r.job, r.tensor, r.sender,
                                 r.receiver, book_egress(r.sender, slot), m.seq, m.delay, m.token});
      break;
    case AnswerKind::redirect:
      out.push_back(sched::Redirect{proxy(), r.id, m.part, m.part_count, m.offset, m.length, r.job, r.tensor, r.sender,
                                    sched::EndpointId{m.target}, r.receiver, sched::AggregateId{m.seq},
                                    book_egress(r.sender, slot)});
      break;
    case AnswerKind::drop:
      out.push_back(sched::Drop{r.id, m.part, m.part_count, m.offset, m.length, r.job, r.sender, r.receiver,
                                drop_reason(m.drop_cause), m.delay});
      break;
    case AnswerKind::aggregate:
      break;  // handled above
  }
}

std::uint64_t DistributedPolicy::token_for(sched::EndpointId receiver, sched::Seq seq) const {
  const auto key = grant_keys_.find(sched::to_int(receiver));
  return key == grant_keys_.end() ? 0 : sidecar::grant_token(key->second, seq);
}

void DistributedPolicy::answer_remote(const sched::Outcome& outcome, sched::Instant now) {
  const auto relative = [&](const sched::Slot& s) {
    return std::pair<std::int64_t, std::int64_t>{std::max<std::int64_t>(0, (s.start - now).count()),
                                                 s.length().count()};
  };
  const auto remote = [&](sched::RequestId id) { return remote_.at(static_cast<std::uint64_t>(id)); };
  // A Grant or a Redirect for a peer's application: answer it; if the peer is gone, release
  // the transfer so its slot and credit are not held.
  const auto move_part = [&](AnswerKind kind, const sched::PartMove& m) {
    const RemoteRequests::Request rr = remote(m.request);
    const auto [start_in, length] = relative(m.slot);
    const auto transfer = static_cast<std::uint64_t>(m.transfer);
    granted_to_peer_[transfer] = rr.peer;
    const std::uint64_t token = kind == AnswerKind::go ? token_for(m.destination, m.tag) : 0;
    if (!send(rr.peer, SlotAnswer{kind,
                                  rr.their_id,
                                  transfer,
                                  m.part,
                                  m.part_count,
                                  m.offset,
                                  m.length,
                                  m.tag,
                                  m.delay,
                                  start_in,
                                  length,
                                  sched::to_int(m.destination),
                                  sched::to_int(m.sender),
                                  {},
                                  DropCause::stale,
                                  token})) {
      granted_to_peer_.erase(transfer);
      finish(m.transfer, now, sched::Nanos{0}, sched::TransferResult::failed);
    }
    if (m.last_part()) remote_.forget(static_cast<std::uint64_t>(m.request));
  };
  std::visit(detail::Overloaded{
                 [&](const sched::Grant& g) { move_part(AnswerKind::go, sched::part_move(g)); },
                 [&](const sched::Redirect& r) { move_part(AnswerKind::redirect, sched::part_move(r)); },
                 [&](const sched::Drop& d) {
                   const RemoteRequests::Request rr = remote(d.request);
                   send(rr.peer, drop_answer(rr.their_id, d.part, d.part_count, d.offset, d.length, d.delay,
                                             drop_cause(d.reason)));
                   if (d.part + 1 == d.part_count) remote_.forget(static_cast<std::uint64_t>(d.request));
                 },
                 [&](const sched::Cancel&) {},  // always local (see schedule())
                 [&](const sched::AggregateGrant& a) {
                   const auto peer = owner_of(a.aggregator);
                   const auto [start_in, length] = relative(a.slot);
                   SlotAnswer m{AnswerKind::aggregate,
                                static_cast<std::uint64_t>(a.aggregate),
                                static_cast<std::uint64_t>(a.transfer),
                                0,
                                1,
                                a.offset,
                                a.length,
                                a.seq,
                                a.delay,
                                start_in,
                                length,
                                sched::to_int(a.receiver),
                                sched::to_int(a.aggregator),
                                {},
                                DropCause::stale,
                                token_for(a.receiver, a.seq)};
                   for (const auto& member : a.members) m.members.push_back(static_cast<std::uint64_t>(member.request));
                   if (peer && send(*peer, m)) {
                     granted_to_peer_[static_cast<std::uint64_t>(a.transfer)] = *peer;
                   } else {
                     finish(a.transfer, now, sched::Nanos{0}, sched::TransferResult::failed);
                   }
                 },
             },
             outcome);
  ++stats_.answers_sent;
}

bool DistributedPolicy::complete(sched::TransferId transfer, sched::Instant now, sched::Nanos measured,
                                 sched::TransferResult result) {
  const auto it = proxies_.find(static_cast<std::uint64_t>(transfer));
  if (it == proxies_.end()) return finish(transfer, now, measured, result);
  send(it->second.peer, TransferDone{it->second.their_transfer, measured.count(), result != sched::TransferResult::ok});
  proxies_.erase(it);
  return true;
}

std::optional<sched::Instant> DistributedPolicy::next_wakeup() const {
  const auto own = scheduler_.next_wakeup();
  if (transport_.peer_count() == 0) return own;
  // Every peer lost: one comes back through our listener or our redialer, which only
  // schedule() looks at (take_joined) — so keep looking, less often. Without it a sidecar
  // whose peers had all died never took their new links while no app asked it anything, and
  // a restarted peer waited for its Hello until its start-up timeout.
  const sched::Instant poll =
      last_now_ + (transport_.peer_count() == lost_.size() ? kLostPeersPollInterval : kPeerPollInterval);
  return own && *own < poll ? own : std::optional<sched::Instant>(poll);
}

void DistributedPolicy::lose_peer(PeerIndex peer, sched::Instant now, std::vector<sched::Outcome>& out) {
  if (!lost_.insert(peer).second) return;
  ++stats_.peers_lost;
  note(
      fmt::format("peer {} lost: its pending requests are dropped (peer_lost), its receivers refused "
                  "(receiver_unreachable) and its transfers failed",
                  transport_.describe(peer)));
  // Our requests it was scheduling: every undecided part is dropped so the application hears.
  forwarded_.drop_undecided(peer, out);
  // Transfers we granted it will never report: release their credit and slots. Their senders
  // live on its host and may be writing still.
  for (auto it = granted_to_peer_.begin(); it != granted_to_peer_.end();) {
    if (it->second == peer) {
      finish(sched::TransferId{it->first}, now, sched::Nanos{0}, sched::TransferResult::sender_lost);
      it = granted_to_peer_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = proxies_.begin(); it != proxies_.end();)
    it = it->second.peer == peer ? proxies_.erase(it) : std::next(it);
}

bool DistributedPolicy::finish(sched::TransferId transfer, sched::Instant now, sched::Nanos measured,
                               sched::TransferResult result) {
  const auto granted = scheduler_.transfer(transfer);
  if (!granted || !scheduler_.complete(transfer, now, measured, result)) return false;
  if (completion_hook_) completion_hook_(transfer, *granted, now, measured, result);
  return true;
}

}  // namespace gradlane::peer
