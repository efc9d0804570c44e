// Worker: the push (request → grant → mirror + write, each a WRITE chained with a zero-length
// doorbell) and the pull (three chained READs checked by the shard's seqlock). Protocol:
// include/gradlane/ps.hpp.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "gradlane/ps/worker.hpp"
#include "common/back_off.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"
#include "ps/protocol/slot_wait.hpp"
#include "ps/worker/aggregator_link.hpp"
#include "ps/worker/worker_state.hpp"

namespace gradlane::ps {
namespace {

// A pull that keeps meeting an apply in progress: an apply takes microseconds to a few
// milliseconds, so this many rounds means the server is stuck mid-apply, not busy.
constexpr std::uint32_t kMaxPullAttempts = 10'000;

// The version word at the start of a header copy (the READ wrote it; nothing else does).
std::uint64_t version_in(const std::byte* header) {
  std::uint64_t v = 0;
  std::memcpy(&v, header, sizeof v);
  return v;
}

}  // namespace

Worker::Worker(const Device& device, const WorkerOptions& options) {
  if (options.id == 0 || options.floats == 0) {
    throw Error(Errc::invalid_argument, "ps::Worker: the id must be > 0 and the shard must have floats");
  }
  if (options.grant_lifetime <= Millis::zero()) {
    throw Error(Errc::invalid_argument, "ps::Worker: grant_lifetime must be > 0 (below the server's hole_timeout)");
  }
  if (options.aggregator && options.sidecar && options.aggregator_endpoint == options.server_endpoint) {
    throw Error(Errc::invalid_argument, "ps::Worker: the aggregator's endpoint is the server's");
  }
  state_ = std::make_unique<State>(device, options);
  State& s = *state_;
  std::tie(s.server_slots, s.server_shard) = s.join(s.server, Addressed::server);
  s.slots = static_cast<std::uint32_t>(s.server_slots.length / s.bytes);
  if (options.sidecar) s.sidecar.emplace(options, s.bytes);
  if (options.replica) {
    s.replica.connect(options.replica->address, options.replica->port, State::connect_bound(options),
                      s.server_slots.length);
  }
  if (options.aggregator) {
    s.aggregator.connect(State::connect_bound(options));
  }
}

Worker::Worker(Worker&&) noexcept = default;
Worker& Worker::operator=(Worker&&) noexcept = default;
Worker::~Worker() = default;

std::span<float> Worker::gradient() {
  return {reinterpret_cast<float*>(state_->gradient_buffer.data()), state_->options.floats};
}

std::span<const float> Worker::model() const {
  return {reinterpret_cast<const float*>(state_->model_buffer.data() + kHeaderBytes), state_->options.floats};
}

void Worker::start_push(std::uint64_t computed_on, std::uint64_t tag) {
  State& s = *state_;
  if (s.push_in_flight) throw Error(Errc::invalid_argument, "start_push: the previous push is still in flight");
  s.push_tag = tag;
  s.push_computed_on = computed_on;
  s.aggregator.take_messages();  // no push waits for a grant there now (and a failed one is dropped)
  s.take_server_notices();
  s.replica.reach_announced(s.server_slots.length);
  s.aggregator.before_push();
  try {
    s.send_request();
  } catch (const Error&) {
    // The server (or the aggregator) failed since the last call and the request went nowhere:
    // fail over and ask the new one (nothing was written, so asking again applies nothing
    // twice). Thrown out of start_push, the error would skip every recovery: the worker would
    // exit on its server's disconnect while the others fail over.
    if (!s.recover()) throw;
    s.send_request();
  }
  s.push_in_flight = true;
}

PushResult Worker::wait_push() {
  State& s = *state_;
  if (!s.push_in_flight) throw Error(Errc::invalid_argument, "wait_push: no push was started");
  s.push_in_flight = false;
  if (s.sidecar) {
    try {
      return s.sidecar->wait(s);
    } catch (const Error&) {
      // A write whose connection failed (the sidecar heard it failed): a redirect to a dead
      // aggregator (later ones are reported lost too), or a go to a dead server — then the
      // replica, promoted, is the server (its sidecar takes the sequence over). Lost, never
      // resent; every other failure is the caller's to see.
      if (!s.recover()) throw;
      return State::lost_push();
    }
  }
  try {
    return s.wait_direct();
  } catch (const Error&) {
    // The update may or may not have reached the server before it failed: never resent (it
    // could be applied twice); the caller pulls and computes the next one.
    if (!s.recover()) throw;
    return State::lost_push();
  }
}

PullResult Worker::pull() {
  State& s = *state_;
  std::byte* first = s.model_buffer.data();
  std::byte* last = first + kHeaderBytes + s.bytes;
  for (std::uint32_t attempt = 1; attempt <= kMaxPullAttempts; ++attempt) {
    // Header, payload, header on one QP; only the last is waited for (RC completes in order).
    // Whatever order the NIC served them in, snapshot_holds() accepts only an exact version.
    try {
      s.server.read(s.model_region, 0, s.server_shard, 0, kHeaderBytes);
      s.server.read(s.model_region, kHeaderBytes, s.server_shard, kHeaderBytes, s.bytes);
      s.server.wait(s.server.read(s.model_region, kHeaderBytes + s.bytes, s.server_shard, 0, kHeaderBytes),
                    s.options.timeout);
    } catch (const Error&) {
      if (!s.recover()) throw;
      continue;  // read the new server's shard
    }
    const std::uint64_t v1 = version_in(first), v2 = version_in(last);
    if (snapshot_holds(v1, s.header_copy_word(offsetof(ShardHeader, checksum)), model(), v2)) {
      s.failovers_at_pull = s.failovers;
      return {v1 / 2, attempt, s.header_copy_word(offsetof(ShardHeader, slowest_clock))};
    }
  }
  throw Error(Errc::timeout, fmt::format("pull from {}: the shard was mid-apply in {} consecutive reads",
                                         s.server.describe(), kMaxPullAttempts));
}

std::uint64_t Worker::server_version() {
  // An odd word means an apply is running: the updates finished are the ones before it.
  return state_->read_server_header_word(offsetof(ShardHeader, version)) / 2;
}

std::uint64_t Worker::slowest_clock() { return state_->read_server_header_word(offsetof(ShardHeader, slowest_clock)); }

PushResult Worker::write_as(std::uint64_t sequence, std::uint64_t token) {
  State& s = *state_;
  // No grant age here: the forward goes out once its members are in, which may be past any
  // grant_lifetime (sidecar_members.cpp). It claims its sequence instead, with the grant's
  // token or, without grant windows, none: the answer opens the slot (a window), or holds the
  // sequence for us (the server does not skip it while our connection lives), or says the
  // server decided it already (skipped: not written, reported lost).
  constexpr Clock::time_point kNoDeadline = Clock::time_point::max();
  try {
    s.sidecar_forward = true;
    const bool mirror_claimed = s.send_claims(sequence, token);
    return s.write_claimed(sequence, kNoDeadline, token, mirror_claimed);
  } catch (const Error&) {
    if (!s.recover()) throw;
    return State::lost_push();
  }
}

std::optional<LandedPush> Worker::last_landed() {
  State& s = *state_;
  if (s.aggregator.up()) {
    throw Error(Errc::invalid_argument,
                fmt::format("worker {}: last_landed() needs a worker pushing to the server (through an aggregator "
                            "the server learns no tags)",
                            s.options.id));
  }
  for (;;) {
    try {
      s.requested_at = Clock::now();  // receive_noting_arrival's reference
      s.server.send(encode(AskLanded{s.options.id}));
      for (;;) {
        const Message answer = s.receive_noting_arrival(s.server).first;
        if (const auto* at = std::get_if<ListeningAt>(&answer)) {
          s.take_listening_at(*at);
          continue;
        }
        if (std::holds_alternative<Opened>(answer)) continue;  // a claim's answer from before a failover
        const auto* landed = std::get_if<Landed>(&answer);
        if (landed == nullptr) {
          throw Error(Errc::protocol, fmt::format("{}: expected the answer to ask-landed, got message kind {}",
                                                  s.server.describe(), answer.index() + 1));
        }
        if (landed->sequence == 0) return std::nullopt;
        return LandedPush{landed->tag, landed->sequence, landed->computed_on};
      }
    } catch (const Error& e) {
      if (e.code() == Errc::protocol || !s.recover()) throw;  // asked the promoted replica again
    }
  }
}

std::uint64_t Worker::failovers() const { return state_->failovers; }

bool out_of_reach(const Error& e) {
  switch (e.code()) {
    case Errc::peer_gone:
    case Errc::unreachable:
    case Errc::route_unresolved:
    case Errc::address_unresolved:
    case Errc::connection_rejected:
    case Errc::port_not_active:
    case Errc::timeout:
      return true;
    default:
      return false;
  }
}

void Worker::announce_aggregator(const std::string& address, std::uint16_t port) {
  state_->server.send(encode(ListeningAt{PeerKind::aggregator, address, port}));
}

std::vector<MemberOutcome> Worker::take_member_outcomes() {
  State& s = *state_;
  if (!s.push_in_flight) s.aggregator.take_messages();
  return s.aggregator.take_outcomes();
}

std::size_t Worker::members_pending() const { return state_->aggregator.pending(); }

bool Worker::settle(Millis timeout) {
  State& s = *state_;
  if (s.push_in_flight) throw Error(Errc::invalid_argument, "settle: a push is in flight (wait_push() first)");
  return s.aggregator.settle(timeout);
}
void Worker::set_job_remaining(std::uint64_t bytes) { state_->job_remaining = bytes; }
std::uint64_t Worker::bytes_copied() const { return state_->bytes_copied; }

}  // namespace gradlane::ps
