// The sidecar-to-sidecar slot-agreement protocol: what crosses the wire between gradlaneds.
//
// Receiver-driven, like a clear-to-send: the sidecar of the sending host forwards each
// application request (SlotRequest, an RTS); the sidecar that hosts the receiving server owns
// that server's ingress timeline, schedules the request with its scheduling core and answers
// each part (SlotAnswer, a CTS: go in a slot / go to an aggregator / drop). When the transfer
// ends, the sender reports it (TransferDone) so the receiver refines bandwidth and frees credit.
//
// Clocks: no clock is shared across hosts. A SlotAnswer carries its slot as a delay relative to
// the moment the receiver sent it (start_in) plus a length; the sender adds start_in to its own
// clock reading at receipt. The one-way message latency therefore makes the sender start a
// little *late*, never early, so slots granted back to back at a receiver cannot overlap by more
// than the difference between two senders' message latencies (microseconds on RDMA).
//
// A peer is untrusted input: decode() checks sizes, kinds and value ranges and throws
// gradlane::Error(protocol) naming what is wrong.
#pragma once

#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "gradlane/error.hpp"

namespace gradlane::peer {

inline constexpr std::uint32_t kMagic = 0x50534c47;  // "GLSP"
// 2: Takeover, SlotAnswer::drop_cause; 3: SlotRequest::job_remaining; 4: SlotRequest::direct_only;
// 5: SlotAnswer::token; 6: Takeover::epoch and job, Hello::takeovers
inline constexpr std::uint16_t kVersion = 6;

// The latest takeover of `endpoint` a sidecar knows of (see Takeover). A hello carries at most
// kMaxTakeoverMarks (2 KiB: with a host's endpoints it fits one 4 KiB control message).
inline constexpr std::uint32_t kMaxTakeoverMarks = 128;
struct TakeoverMark {
  std::uint32_t endpoint = 0;
  std::uint64_t epoch = 0;
  std::uint32_t job = 0;
};

// First message on a link: which scheduler endpoints (NICs) the sending sidecar hosts, and the
// takeovers it knows of, so a sidecar that (re)joins never fences with an epoch already used.
struct Hello {
  std::vector<std::uint32_t> endpoints;
  std::vector<TakeoverMark> takeovers;
};

struct SlotRequest {
  std::uint64_t request = 0;  // the sender sidecar's request id (echoed in answers)
  std::uint32_t job = 0;
  std::uint32_t sender = 0;
  std::uint32_t receiver = 0;
  std::uint32_t tensor = 0;
  std::uint64_t bytes = 0;
  std::uint64_t computed_on = 0;
  double gradient_norm = 0.0;
  std::uint32_t priority = 0;
  std::uint64_t job_remaining = 0;  // sched::Request::job_remaining
  bool direct_only = false;         // sched::Request::direct_only
};

enum class AnswerKind : std::uint8_t { go = 1, redirect = 2, drop = 3, aggregate = 4 };
// Why a part was dropped (drop answers only): too stale, or its receiver moved to another
// sidecar before it was decided (sched::DropReason::receiver_moved).
// refused: the receiver's sidecar would not hold the request (too large, or too much pending
// from this peer); not stale, the same request may be taken later.
enum class DropCause : std::uint8_t {
  stale = 0,
  receiver_moved = 1,
  receiver_of_another_job = 2,
  refused = 3,
  version_from_future = 4
};

struct SlotAnswer {
  AnswerKind kind = AnswerKind::go;
  std::uint64_t request = 0;   // SlotRequest::request (aggregate: the aggregate id)
  std::uint64_t transfer = 0;  // the receiver's transfer id, for TransferDone (0 for drop)
  std::uint32_t part = 0;
  std::uint32_t part_count = 1;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::uint64_t seq = 0;                    // go/aggregate: sequence at the server; redirect: aggregate id
  std::uint64_t delay = 0;                  // staleness at apply (go) or that caused the drop
  std::int64_t start_in_ns = 0;             // slot start, relative to when this answer was sent (>= 0)
  std::int64_t length_ns = 0;               // slot length (>= 0)
  std::uint32_t target = 0;                 // go/aggregate: the server; redirect: the aggregator
  std::uint32_t sender = 0;                 // the endpoint that sends (aggregate: the aggregator)
  std::vector<std::uint64_t> members;       // aggregate: member request ids (sender-side ids)
  DropCause drop_cause = DropCause::stale;  // drop only; stale otherwise
  // go/aggregate: the grant token of `seq` (gradlane/sidecar.hpp), when the receiver's server
  // gave its sidecar a key; the grantee shows it to the server. 0: none.
  std::uint64_t token = 0;
};

struct TransferDone {
  std::uint64_t transfer = 0;
  std::int64_t measured_ns = 0;
  bool failed = false;
};

// Sent to every peer by a sidecar whose host's replica was promoted to be `endpoint`'s server:
// from now on it hands out that receiver's sequence, from `version` + 1. Its old owner drops
// what it had pending for it (receiver_moved) and answers later requests for it with drops;
// every sidecar forwards new requests for it here.
// `epoch` fences takeovers: each takeover of an endpoint carries one more than the latest its
// sender knew of (the first: 1), and a sidecar takes only an epoch past every one it knows for
// that endpoint, so a stale or repeated takeover changes nothing. `job`: the job whose replica
// took over; a sidecar refuses it while a server attached there serves the endpoint and is
// alive, or is an app of another job.
struct Takeover {
  std::uint32_t endpoint = 0;
  std::uint64_t version = 0;
  std::uint64_t epoch = 1;
  std::uint32_t job = 0;
};

using Message = std::variant<Hello, SlotRequest, SlotAnswer, TransferDone, Takeover>;

std::vector<std::byte> encode(const Message& message);
Message decode(std::span<const std::byte> bytes);

}  // namespace gradlane::peer
