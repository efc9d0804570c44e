// Entries in, outcomes out: the daemon's data path between the app queues and the policy.
//
// Ids. Apps name their requests with their own ids (any u64, unique among their outstanding
// requests). The policy needs ids unique across apps, so the daemon gives each accepted
// request its own sched::RequestId and keeps both directions: routes_ (policy id -> app slot
// and app id) to deliver outcomes, and AppSession::owed (app id -> policy id, open transfers)
// to take completions and to clean up when the app leaves. An outcome whose route is gone
// belongs to an app that left: its transfer is completed as failed so the policy's credit and
// slots do not leak.
#include <algorithm>
#include <limits>
#include <type_traits>
#include <variant>

#include "common/overloaded.hpp"
#include "gradlane/sidecar.hpp"
#include "sidecar/daemon/daemon.hpp"
#include "sidecar/shm/futex.hpp"

namespace gradlane::sidecar {
namespace {

Reason reason_for(sched::SubmitStatus status) {
  switch (status) {
    case sched::SubmitStatus::empty_request:
      return Reason::bad_size;
    case sched::SubmitStatus::sender_is_receiver:
      return Reason::bad_receiver;
    case sched::SubmitStatus::duplicate_id:
      return Reason::duplicate_request;
    case sched::SubmitStatus::version_from_future:
      return Reason::version_from_future;
    case sched::SubmitStatus::receiver_unreachable:
      return Reason::receiver_unreachable;
    case sched::SubmitStatus::unknown_receiver:
      return Reason::unknown_receiver;
    case sched::SubmitStatus::receiver_of_another_job:
      return Reason::receiver_of_another_job;
    case sched::SubmitStatus::accepted:
      break;
  }
  return Reason::none;
}

Reason reason_for(sched::DropReason reason) {
  switch (reason) {
    case sched::DropReason::staleness_bound:
      return Reason::stale;
    case sched::DropReason::peer_lost:
      return Reason::peer_lost;
    case sched::DropReason::receiver_moved:
      return Reason::receiver_moved;
    case sched::DropReason::receiver_of_another_job:
      return Reason::receiver_of_another_job;
    case sched::DropReason::peer_refused:
      return Reason::peer_refused;
    case sched::DropReason::version_from_future:
      return Reason::version_from_future;
  }
  return Reason::none;
}

shm::GrantEntry grant_entry(shm::GrantKind kind, std::uint64_t request, std::uint32_t target, std::uint64_t sequence,
                            const sched::Slot& slot, std::uint64_t offset, std::uint64_t length, std::uint32_t part,
                            std::uint32_t part_count) {
  return shm::GrantEntry{.format = shm::kEntryFormat,
                         .kind = kind,
                         .reason = static_cast<std::uint8_t>(Reason::none),
                         .target = target,
                         .request = request,
                         .sequence = sequence,
                         .slot_start_ns = slot.start.time_since_epoch().count(),
                         .slot_length_ns = slot.length().count(),
                         .part_offset = offset,
                         .part_bytes = length,
                         .part_index = part,
                         .part_count = part_count,
                         .token = 0,
                         .reserved = {}};
}

sched::Nanos wire_time(std::uint64_t ns) {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<sched::Nanos::rep>::max());
  return sched::Nanos(static_cast<sched::Nanos::rep>(ns > kMax ? kMax : ns));
}

}  // namespace

std::size_t Daemon::drain(AppSession& app, sched::Instant now) {
  if (app.deferred(now)) return 0;
  const std::size_t taken = take_entries(app, now);
  if (app.over_bound) app.read_again_at = now + config_.over_bound_every;
  return taken;
}

std::size_t Daemon::take_entries(AppSession& app, sched::Instant now) {
  std::size_t taken = 0;
  shm::AppEntry entry;
  // Stop while answers back up: the app is not reading, so its requests wait in its own ring.
  while (taken < (app.over_bound ? 1 : config_.batch_per_app) && app.outbox.empty()) {
    switch (app.requests.pop(entry)) {
      case shm::RingStatus::ok:
        ++taken;
        handle(app, entry, now);
        break;
      case shm::RingStatus::corrupt:
        evict(app, Reason::corrupt_ring, now);  // `app` is gone after this
        return taken + 1;
      case shm::RingStatus::empty:
      case shm::RingStatus::full:
        return taken;
    }
  }
  return taken;
}

void Daemon::handle(AppSession& app, const shm::AppEntry& entry, sched::Instant now) {
  if (const auto reason = check_envelope(entry)) {
    answer_error(app, entry, *reason);
    return;
  }
  if (entry.op == shm::Op::submit) {
    submit(app, entry, now);
  } else if (entry.op == shm::Op::applied) {
    applied(app, entry);
  } else {
    complete(app, entry, now);
  }
}

void Daemon::submit(AppSession& app, const shm::AppEntry& entry, sched::Instant now) {
  if (const auto reason = check_submit(entry, app.limits)) {
    answer_error(app, entry, *reason);
    return;
  }
  if (app.owed.size() >= config_.max_outstanding ||
      entry.body.submit.bytes > config_.max_owed_bytes - app.owed_bytes) {  // owed_bytes <= max: no underflow
    app.over_bound = true;
    answer_error(app, entry, Reason::too_many_outstanding);
    return;
  }
  const auto [it, inserted] = app.owed.try_emplace(entry.request);
  if (!inserted) {
    answer_error(app, entry, Reason::duplicate_request);
    return;
  }
  const auto& s = entry.body.submit;
  const sched::RequestId id{next_request_++};
  const sched::Request request{.id = id,
                               .job = sched::JobId{entry.job},
                               .sender = sched::EndpointId{app.limits.endpoint},
                               .receiver = sched::EndpointId{s.receiver},
                               .tensor = sched::TensorId{s.tensor},
                               .bytes = s.bytes,
                               .computed_on = s.computed_on,
                               .gradient_norm = s.gradient_norm,
                               .priority = s.priority,
                               .job_remaining = s.job_remaining,
                               .direct_only = (entry.flags & shm::kSubmitDirectOnly) != 0};
  const sched::SubmitStatus status = policy_->submit(request, now);
  if (status != sched::SubmitStatus::accepted) {
    app.owed.erase(it);
    answer_error(app, entry, reason_for(status));
    return;
  }
  it->second.id = id;
  it->second.bytes = s.bytes;
  it->second.submitted = now;
  app.owed_bytes += s.bytes;
  routes_.emplace(id, Route{app.slot, entry.request});
  ++inputs_;
  ++stats_.submitted;
}

void Daemon::applied(AppSession& app, const shm::AppEntry& entry) {
  if (const auto reason = check_applied(entry, app.limits)) {
    answer_error(app, entry, *reason);
    return;
  }
  const auto& a = entry.body.applied;
  // Only the receiver's server app: another app of the endpoint (a worker on the server's
  // host, of this job or another) would otherwise free slots that still hold updates.
  if (receiver_server(a.receiver, app.limits.job) != &app) {
    answer_error(app, entry, Reason::bad_receiver);
    return;
  }
  // An ack beyond what was granted is the app's mistake: refused, nothing changes.
  if (!policy_->replica_ack(sched::EndpointId{a.receiver}, a.through)) {
    answer_error(app, entry, Reason::bad_value);
    return;
  }
  ++inputs_;
  ++stats_.acknowledged;
}

void Daemon::complete(AppSession& app, const shm::AppEntry& entry, sched::Instant now) {
  if (const auto reason = check_complete(entry)) {
    answer_error(app, entry, *reason);
    return;
  }
  const auto& c = entry.body.complete;
  const auto result = c.failed != 0 ? sched::TransferResult::failed : sched::TransferResult::ok;
  sched::TransferId transfer{};
  if (entry.op == shm::Op::complete_aggregate) {
    const auto it = app.aggregates.find(entry.request);
    if (it == app.aggregates.end()) {
      answer_error(app, entry, Reason::unknown_request);
      return;
    }
    transfer = it->second;
    app.aggregates.erase(it);
  } else {
    const auto it = app.owed.find(entry.request);
    if (it == app.owed.end()) {
      answer_error(app, entry, Reason::unknown_request);
      return;
    }
    const auto open = it->second.granted.take(c.part);
    if (!open) {
      answer_error(app, entry, Reason::unknown_request);
      return;
    }
    transfer = *open;
    if (it->second.settled()) settle(app, entry.request, now);
  }
  policy_->complete(transfer, now, wire_time(c.measured_ns), result);
  ++inputs_;
  ++stats_.completed;
}

std::size_t Daemon::schedule_and_route(sched::Instant now) {
  outcomes_.clear();
  policy_->schedule(now, outcomes_);  // the one call into scheduling
  inputs_ = 0;
  for (const sched::Outcome& outcome : outcomes_) route(outcome, now);
  return outcomes_.size();
}

void Daemon::route(const sched::Outcome& outcome, sched::Instant now) {
  record_.decided(outcome);
  // The app a part outcome belongs to, or nullptr (it left; fail its transfer back).
  struct Owner {
    AppSession* app = nullptr;
    OwedRequest* owed = nullptr;
    std::uint64_t app_request = 0;
  };
  const auto owner = [&](sched::RequestId id) -> Owner {
    const auto r = routes_.find(id);
    if (r == routes_.end()) return {};
    AppSession& app = *apps_[r->second.slot];
    return {&app, &app.owed.at(r->second.app_request), r->second.app_request};
  };
  const auto orphan = [&](sched::TransferId transfer) {
    policy_->complete(transfer, now, sched::Nanos{0}, sched::TransferResult::failed);
    ++inputs_;
    ++stats_.orphaned;
  };
  // A Grant (to the server, tagged with its sequence) or a Redirect (to an aggregator, tagged
  // with the aggregate) goes to the app that asked, which then owes a completion for it.
  const auto move_part = [&](shm::GrantKind kind, const sched::PartMove& m, std::uint64_t token) {
    const auto [app, owed, app_request] = owner(m.request);
    if (app == nullptr) return orphan(m.transfer);
    owed->part_count = m.part_count;
    ++owed->decided;
    owed->granted.add(m.part, m.transfer);
    shm::GrantEntry e = grant_entry(kind, app_request, sched::to_int(m.destination), m.tag, m.slot, m.offset, m.length,
                                    m.part, m.part_count);
    e.token = token;
    answer(*app, e);
  };

  std::visit(
      detail::Overloaded{
          [&](const sched::Grant& g) {
            move_part(shm::GrantKind::go, sched::part_move(g), grant_token(sched::to_int(g.receiver), g.seq, g.token));
          },
          [&](const sched::Redirect& r) { move_part(shm::GrantKind::redirect, sched::part_move(r), 0); },
          [&](const sched::Drop& d) {
            const auto [app, owed, app_request] = owner(d.request);
            if (app == nullptr) {
              ++stats_.orphaned;
              return;
            }
            owed->part_count = d.part_count;
            ++owed->decided;
            shm::GrantEntry e = grant_entry(shm::GrantKind::drop, app_request, sched::to_int(d.receiver), 0,
                                            sched::Slot{}, d.offset, d.length, d.part, d.part_count);
            e.reason = static_cast<std::uint8_t>(reason_for(d.reason));
            answer(*app, e);
            if (owed->settled()) settle(*app, app_request, now);
          },
          [&](const sched::Cancel& c) {
            // To the receiver's server app: it skips the sequence instead of waiting. (Not to
            // any app of the job on that endpoint: that may be a worker beside the server.)
            if (AppSession* server = receiver_server(sched::to_int(c.receiver), sched::to_int(c.job))) {
              shm::GrantEntry e =
                  grant_entry(shm::GrantKind::cancel, 0, sched::to_int(c.receiver), c.seq, sched::Slot{}, 0, 0, 0, 1);
              // Its sender's sidecar was lost: the sender may still write it (peer_lost).
              if (c.sender_may_write) e.reason = static_cast<std::uint8_t>(Reason::peer_lost);
              answer(*server, e);
              ++stats_.cancelled;
              return;
            }
            ++stats_.unrouted;  // no server app here: nobody waits for that sequence
          },
          [&](const sched::AggregateGrant& a) {
            // The aggregator's own app forwards the sum; it is local if an app of that job
            // attached from the aggregator's NIC. Otherwise the peer protocol (not here) must
            // carry it; until it does, the transfer is failed back so the slot is not held.
            for (const std::uint32_t slot : active_) {
              AppSession& app = *apps_[slot];
              if (app.limits.job == sched::to_int(a.job) && app.limits.endpoint == sched::to_int(a.aggregator)) {
                app.aggregates.emplace(sched::to_int(a.aggregate), a.transfer);
                shm::GrantEntry e =
                    grant_entry(shm::GrantKind::aggregate, sched::to_int(a.aggregate), sched::to_int(a.receiver), a.seq,
                                a.slot, a.offset, a.length, 0, static_cast<std::uint32_t>(a.members.size()));
                e.token = grant_token(sched::to_int(a.receiver), a.seq, a.token);
                answer(app, e);
                return;
              }
            }
            ++stats_.unrouted;
            orphan(a.transfer);
          },
      },
      outcome);
}

std::uint64_t Daemon::grant_token(std::uint32_t receiver, std::uint64_t seq, std::uint64_t carried) const {
  return receivers_.token(receiver, seq, carried, policy_->hands_out(sched::EndpointId{receiver}));
}

void Daemon::answer(AppSession& app, const shm::GrantEntry& grant) {
  ++stats_.answers;
  // Behind a backlog the ring must not be used, or answers would overtake each other.
  if (!app.outbox.empty() || app.grants.push(grant) != shm::RingStatus::ok) {
    app.outbox.push_back(grant);  // full, or corrupt (publish() evicts)
    return;
  }
  if (!app.notify) {
    app.notify = true;
    touched_.push_back(app.slot);
  }
}

void Daemon::answer_error(AppSession& app, const shm::AppEntry& entry, Reason reason) {
  ++stats_.errors;
  shm::GrantEntry e{};
  e.format = shm::kEntryFormat;
  e.kind = shm::GrantKind::error;
  e.reason = static_cast<std::uint8_t>(reason);
  // Which operation was refused, so the client knows whether a request or a completion failed.
  e.target = static_cast<std::uint32_t>(entry.op);
  e.request = entry.request;
  e.part_index = entry.op == shm::Op::complete ? entry.body.complete.part : 0;
  e.part_count = 1;
  answer(app, e);
}

void Daemon::settle(AppSession& app, std::uint64_t app_request, sched::Instant now) {
  const auto it = app.owed.find(app_request);
  record_.settled(app.limits.endpoint, now - it->second.submitted);
  routes_.erase(it->second.id);
  app.owed_bytes -= it->second.bytes;
  app.owed.erase(it);
  app.over_bound = false;
}

std::size_t Daemon::publish(sched::Instant now) {
  std::size_t moved = 0;
  for (std::size_t i = 0; i < active_.size(); ++i) {
    AppSession& app = *apps_[active_[i]];
    while (!app.outbox.empty()) {
      const shm::RingStatus status = app.grants.push(app.outbox.front());
      if (status == shm::RingStatus::full) break;
      if (status == shm::RingStatus::corrupt) {
        evict(app, Reason::corrupt_ring, now);
        --i;  // active_[i] was removed
        break;
      }
      app.outbox.pop_front();
      ++moved;
      if (!app.notify) {
        app.notify = true;
        touched_.push_back(app.slot);
      }
    }
  }
  if (touched_.empty()) return moved;
  std::atomic_thread_fence(std::memory_order_seq_cst);  // one fence for all apps (see futex.hpp)
  for (const std::uint32_t slot : touched_) {
    if (!apps_[slot]) continue;  // evicted meanwhile
    apps_[slot]->notify = false;
    shm::AppSlot& s = slot_ref(slot);
    if (s.app_sleeping.load(std::memory_order_relaxed) != 0) {
      s.grant_bell.fetch_add(1, std::memory_order_release);
      shm::futex_wake(s.grant_bell);
    }
  }
  touched_.clear();
  return moved;
}

}  // namespace gradlane::sidecar
