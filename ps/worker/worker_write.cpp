// Worker::State, writing a granted push: the mirror and the server's slot (or the aggregator's
// member slot), grant windows' claims, and the sequence floor a takeover sets.
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

bool Worker::State::claim_mirror(std::uint64_t sequence, std::uint64_t token) {
  if (token == 0 || !mirroring()) return false;
  replica.connection().send(encode(Claim{sequence, token}));
  return true;
}

bool Worker::State::send_claims(std::uint64_t sequence, std::uint64_t token) {
  server.send(encode(Claim{sequence, token}));
  return claim_mirror(sequence, token);
}

PushResult Worker::State::write(std::uint64_t sequence, Clock::time_point deadline, std::uint32_t window_rkey,
                                std::uint64_t token, bool mirror_claimed) {
  if (aggregator.up() && !sidecar) {  // a member slot of the aggregator's ring
    PushResult member = write_member(aggregator.slot_of(sequence), static_cast<std::uint32_t>(sequence));
    member.sequence = sequence;  // the aggregator's member sequence
    aggregator.took(sequence, push_tag);
    return member;
  }
  const auto imm = static_cast<std::uint32_t>(sequence);  // low 32 bits: ApplyOrder::widen
  const auto start = Clock::now();
  // With a token, only into a claimed slot: a replica found during this push (one that joined,
  // announced while we waited for the server's answer) is mirrored to from the next push on,
  // and reads this one from the server's slot.
  const bool mirrors = mirroring() && (token == 0 || mirror_claimed);
  const std::uint64_t offset = (sequence % slots) * bytes;
  RegionDescriptor mirror_slot{replica.slots().addr + offset, bytes, replica.slots().rkey};
  if (mirrors && mirror_claimed) {  // the replica's answer: a window over its slot for us
    mirror_slot.rkey = await_window(replica.connection(), sequence);
    if (mirror_slot.rkey == 0) return decided_before_claim(sequence, "replica");
  }
  // A payload of at most max_inline bytes is posted inline: the provider copies it into the
  // work request (connection.hpp). Counted per copy written: 1 + mirror.
  if (bytes <= options.transport.max_inline) bytes_copied += bytes * (mirrors ? 2 : 1);
  // The mirror first: if this worker dies between the two, the server never sees the update
  // and skips it, and so does the replica (it applies only what the server decided).
  std::optional<OpId> mirrored;
  if (mirrors && replica.announce_now()) {  // a joined replica: ahead of the first mirror, on the same QP
    replica.connection().send(encode(Mirroring{options.id, sequence}));
  }
  // Sidecar mode: what the mirror is, for a replica promoted before the server decided it (only
  // the server hears it otherwise, and a tag guessed is wrong after a dropped or lost push).
  if (mirrors && sidecar) replica.connection().send(encode(Pushing{sequence, push_tag, push_computed_on}));
  if (mirrors) mirrored = replica.connection().write_and_ring(gradient_region, 0, mirror_slot, 0, bytes, imm);
  // The replica's refusal floor, READ behind the mirror on the same QP. A server SIGKILLed a
  // moment ago still has its writes acknowledged by the kernel, while the replica, promoted
  // meanwhile, refuses the mirror (below the floor it took over at): that push would be
  // acknowledged and applied nowhere. Read into a spare word of our header copy (past the last
  // field), so it lands on no other READ's word.
  constexpr std::size_t kReplicaFloorAt = offsetof(ShardHeader, tensor) + sizeof(std::uint64_t);
  static_assert(kReplicaFloorAt + sizeof(std::uint64_t) <= sizeof(ShardHeader));
  if (mirrored) {
    mirrored = replica.connection().read(model_region, kReplicaFloorAt, replica.shard(),
                                         offsetof(ShardHeader, refuse_below), sizeof(std::uint64_t));
  }
  // Sidecar mode: ours, or the sidecar-mode aggregator's forward (write_as).
  const bool floors = sidecar.has_value() || sidecar_forward;
  // The grant's age once more, right before the server's write. A stall since too_late() — a
  // SIGSTOP delivered as the mirror's post returned; the server may skip the sequence
  // meanwhile, and the late write would still be acknowledged here — may have outlived
  // the server's hole_timeout (sidecar mode: its skip of a stuck head, which a floor READ
  // does not show). Between this clock read and the post there is only the provider's work
  // request left; a sidecar-mode claim closes even that.
  if (Clock::now() > deadline) {
    if (mirrored) replica.connection().wait(*mirrored, options.timeout);  // held there until the server's skip
    std::fprintf(stderr,
                 "gradlane ps worker %u: stalled past the grant of sequence %llu before writing it to the "
                 "server (grant_lifetime %lld ms): not written, reported lost\n",
                 options.id, static_cast<unsigned long long>(sequence),
                 static_cast<long long>(options.grant_lifetime.count()));
    return lost_push();
  }
  // Sidecar mode: the server learns the push's tag and version from this, ahead of the doorbell
  // (Worker::last_landed). Not for an aggregator's forward, whose members' tags are elsewhere.
  if (sidecar) server.send(encode(Pushing{sequence, push_tag, push_computed_on}));
  const OpId written =
      window_rkey == 0
          ? server.write_and_ring(gradient_region, 0, server_slots, offset, bytes, imm)
          : server.write_and_ring(gradient_region, 0, {server_slots.addr + offset, bytes, window_rkey}, 0, bytes, imm);
  // Sidecar mode: the server's refusal floor, READ behind the write on the same QP (so it
  // completes after it, and waiting for it waits for the write).
  constexpr std::size_t kFloorAt = offsetof(ShardHeader, refuse_below);
  const OpId last_on_server =
      floors ? server.read(model_region, kFloorAt, server_shard, kFloorAt, sizeof(std::uint64_t)) : written;
  if (mirrored) replica.connection().wait(*mirrored, options.timeout);
  server.wait(last_on_server, options.timeout);
  PushResult result;
  result.sequence = sequence;
  result.wire_time = Clock::now() - start;
  if (floors && refused_below_floor(sequence, kFloorAt)) result.lost = true;
  if (floors && failovers > 0 && header_copy_word(kFloorAt) == 0) {
    wrote_to_unpromoted_replica(sequence);
    return lost_push();  // not at the owner of the sequence: failed, so its sidecar cancels it
  }
  if (mirrored && refused_below_floor(sequence, kReplicaFloorAt)) result.lost = true;
  return result;
}

void Worker::State::wrote_to_unpromoted_replica(std::uint64_t sequence) {
  if (failing_over()) {
    std::fprintf(stderr,
                 "gradlane ps worker %u: sequence %llu written to %s, a replica not promoted (yet): reported lost\n",
                 options.id, static_cast<unsigned long long>(sequence), server.describe().c_str());
    return;
  }
  throw Error(Errc::unreachable,
              fmt::format("{}: the replica this worker failed over to was not promoted within {} ms (its server "
                          "lives; our link to the server failed): reconnect to the server",
                          server.describe(), options.failover_patience.count()));
}

std::uint64_t Worker::State::header_copy_word(std::size_t at) const {
  std::uint64_t word = 0;
  std::memcpy(&word, model_buffer.data() + at, sizeof word);
  return word;
}

std::uint64_t Worker::State::read_server_header_word(std::size_t at) {
  for (;;) {
    try {
      server.wait(server.read(model_region, at, server_shard, at, sizeof(std::uint64_t)), options.timeout);
      return header_copy_word(at);
    } catch (const Error&) {
      if (!recover()) throw;
    }
  }
}

PushResult Worker::State::write_member(std::uint64_t slot, std::uint32_t imm) {
  const auto start = Clock::now();
  if (bytes <= options.transport.max_inline) bytes_copied += bytes;
  Connection& conn = aggregator.connection();
  conn.wait(conn.write_and_ring(gradient_region, 0, aggregator.ring(), slot * bytes, bytes, imm), options.timeout);
  PushResult result;
  result.wire_time = Clock::now() - start;
  result.pending = true;
  return result;
}

PushResult Worker::State::write_claimed(std::uint64_t sequence, Clock::time_point deadline, std::uint64_t token,
                                        bool mirror_claimed) {
  const std::uint32_t window_rkey = await_window(server, sequence);
  if (window_rkey != 0) return write(sequence, deadline, window_rkey, token, mirror_claimed);
  if (mirror_claimed) (void)await_window(replica.connection(), sequence);  // not left for the next push to read
  return decided_before_claim(sequence, "server");
}

std::uint32_t Worker::State::await_window(Connection& conn, std::uint64_t sequence) {
  for (;;) {
    const Message answer = receive_noting_arrival(conn).first;
    if (const auto* at = std::get_if<ListeningAt>(&answer); at != nullptr && &conn == &server) {
      take_listening_at(*at);
      continue;
    }
    const auto* opened = std::get_if<Opened>(&answer);
    if (opened == nullptr) {
      throw Error(Errc::protocol,
                  fmt::format("{}: expected the answer to the claim of sequence {}, got message kind {}",
                              conn.describe(), sequence, answer.index() + 1));
    }
    if (opened->sequence == sequence) return opened->window_rkey;
  }
}

PushResult Worker::State::decided_before_claim(std::uint64_t sequence, const char* where) const {
  std::fprintf(stderr,
               "gradlane ps worker %u: the %s had decided sequence %llu before our claim: not written, "
               "reported lost\n",
               options.id, where, static_cast<unsigned long long>(sequence));
  return lost_push();
}

}  // namespace gradlane::ps
