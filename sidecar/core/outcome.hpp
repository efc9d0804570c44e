// Outcomes: what schedule() decides. Every part of every accepted request gets exactly one of
// Grant, Redirect or Drop. Each group of Redirects is later followed by exactly one
// AggregateGrant, addressed to the aggregator. A Grant or AggregateGrant whose transfer fails
// is followed by one Cancel of its sequence number, addressed to the receiver.
//
// Slot times are on the scheduler's local timeline (types.hpp). A slot is a reservation: the
// sender should start the transfer at slot.start (not earlier: the previous slot's transfer
// owns the link until then) and it is predicted to end at slot.end from the measured bandwidth.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>
#include <vector>

#include "sidecar/core/types.hpp"

namespace gradlane::sched {

// Send this part straight to the server, starting at slot.start.
struct Grant {
  TransferId transfer{};  // pass to Scheduler::complete() when the transfer ends
  RequestId request{};
  std::uint32_t part = 0;  // part index, of part_count
  std::uint32_t part_count = 1;
  Bytes offset = 0;  // bytes [offset, offset + length) of the tensor
  Bytes length = 0;
  JobId job{};
  TensorId tensor{};
  EndpointId sender{};
  EndpointId receiver{};
  Slot slot{};              // on the sender's egress and the receiver's ingress
  Seq seq = 0;              // the server applies it as update `seq`: version seq-1 -> seq
  std::uint64_t delay = 0;  // its delay at apply (staleness.hpp); always <= tau
  // Not the core's: the grant token of `seq` from the receiver's owner (a peer's answer); the
  // core leaves it 0 and the routing layers stamp their own receivers' (types.hpp GrantKey).
  std::uint64_t token = 0;
};

// Send this part to `aggregator` (at slot.start) instead; it will be summed with the other
// members of `aggregate` and reach `receiver` as one update. The members of a group are booked
// back to back on the aggregator's ingress when the group forms, so a member's slot may start
// beyond the grant horizon (by at most max_group - 1 member transfers).
struct Redirect {
  TransferId transfer{};
  RequestId request{};
  std::uint32_t part = 0;
  std::uint32_t part_count = 1;
  Bytes offset = 0;
  Bytes length = 0;
  JobId job{};
  TensorId tensor{};
  EndpointId sender{};
  EndpointId aggregator{};
  EndpointId receiver{};  // where the aggregate will go
  AggregateId aggregate{};
  Slot slot{};  // on the sender's egress and the aggregator's ingress
};

// The aggregator's sum of `members` goes to the server at slot.start (and not before all
// members have arrived and been summed).
struct AggregateGrant {
  TransferId transfer{};
  AggregateId aggregate{};
  JobId job{};
  TensorId tensor{};
  Bytes offset = 0;
  Bytes length = 0;
  EndpointId aggregator{};
  EndpointId receiver{};
  std::vector<PartRef> members;  // in the order they were redirected
  Slot slot{};
  Seq seq = 0;
  // The largest member delay at apply, counting only the own parts sequenced before the group
  // formed (an upper bound: a member's later parts may have been applied since); <= tau.
  std::uint64_t delay = 0;
  std::uint64_t token = 0;  // as Grant::token
};

enum class DropReason : std::uint8_t {
  // Applied next, it would already be more than tau versions stale; versions only grow.
  staleness_bound,
  // Not the scheduler's: the peer sidecar that owns the receiver's sequence was lost before it
  // decided this part (DistributedPolicy). The update is not stale; nobody can sequence it now.
  peer_lost,
  // The receiver's sequence moved to another owner (its server failed over to a replica that
  // a sidecar elsewhere now schedules) before this part was decided. Not stale: ask again, the
  // request reaches the new owner.
  receiver_moved,
  // Not the scheduler's: the receiver's sidecar refused the request, its server being an app
  // of another job (Scheduler::serve_job). Not stale; asking again gets the same answer.
  receiver_of_another_job,
  // Not the scheduler's: the receiver's sidecar would not hold the request, it being larger
  // than a peer may ask for or its sender's sidecar having too many requests or bytes pending
  // there (DistributedPolicy's bounds). Not stale; the push did not happen.
  peer_refused,
  // Not the scheduler's: the receiver's sidecar refused the request, computed on a version its
  // server's sequence has not reached (a model pulled from a server that got further than the
  // replica that took over, or from another server). Not stale: the push did not happen.
  version_from_future,
};
inline constexpr std::size_t kDropReasons = 6;

// Its short name in logs and metrics (staleness_bound is "stale").
constexpr std::string_view drop_reason_name(DropReason reason) {
  switch (reason) {
    case DropReason::staleness_bound:
      return "stale";
    case DropReason::peer_lost:
      return "peer_lost";
    case DropReason::receiver_moved:
      return "receiver_moved";
    case DropReason::receiver_of_another_job:
      return "receiver_of_another_job";
    case DropReason::peer_refused:
      return "peer_refused";
    case DropReason::version_from_future:
      return "version_from_future";
  }
  return "unknown";
}

// Do not send this part; tell the application. For staleness_bound it should pull a fresh
// model and recompute; for peer_lost the receiver is unreachable until its sidecar returns;
// for receiver_moved a new request goes to the receiver's new owner.
struct Drop {
  RequestId request{};
  std::uint32_t part = 0;
  std::uint32_t part_count = 1;
  Bytes offset = 0;
  Bytes length = 0;
  JobId job{};
  EndpointId sender{};
  EndpointId receiver{};
  DropReason reason = DropReason::staleness_bound;
  std::uint64_t delay = 0;  // staleness_bound: its delay if applied next (> tau); else 0
};

// Sequence `seq` at `receiver` was granted but its transfer failed (or its sender left): it will
// never be written. The server and the replica skip it in order instead of waiting for it.
// Emitted by the schedule() after the failed complete().
struct Cancel {
  TransferId transfer{};
  JobId job{};
  EndpointId receiver{};
  Seq seq = 0;
  // Its sender's sidecar was lost, not the sender (TransferResult::sender_lost): its write may
  // still come. A server whose slots no window closes must not let it land in a reused slot.
  bool sender_may_write = false;
};

using Outcome = std::variant<Grant, Redirect, AggregateGrant, Drop, Cancel>;

// What a Grant and a Redirect have in common: one part of a request moving from `sender` to
// `destination` (the server for a Grant, the aggregator for a Redirect) in `slot`. The layers
// that route outcomes (the daemon's queues, the peer protocol) treat both alike but for the
// destination and the tag: the sequence number of a Grant, the aggregate of a Redirect.
struct PartMove {
  TransferId transfer{};
  RequestId request{};
  std::uint32_t part = 0;
  std::uint32_t part_count = 1;
  Bytes offset = 0;
  Bytes length = 0;
  EndpointId sender{};
  EndpointId destination{};
  std::uint64_t tag = 0;    // Grant: seq; Redirect: the AggregateId
  std::uint64_t delay = 0;  // Grant: its delay at apply; Redirect: 0
  Slot slot{};
  bool last_part() const noexcept { return part + 1 == part_count; }
};

inline PartMove part_move(const Grant& g) {
  return {g.transfer, g.request,  g.part, g.part_count, g.offset, g.length,
          g.sender,   g.receiver, g.seq,  g.delay,      g.slot};
}
inline PartMove part_move(const Redirect& r) {
  return {r.transfer,
          r.request,
          r.part,
          r.part_count,
          r.offset,
          r.length,
          r.sender,
          r.aggregator,
          static_cast<std::uint64_t>(r.aggregate),
          0,
          r.slot};
}

}  // namespace gradlane::sched
