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

namespace gradlane::ps {
namespace {

using Clock = std::chrono::steady_clock;

// A pull that keeps meeting an apply in progress: an apply takes microseconds to a few
// milliseconds, so this many rounds means the server is stuck mid-apply, not busy.
constexpr std::uint32_t kMaxPullAttempts = 10'000;

// The version word at the start of a header copy (the READ wrote it; nothing else does).
std::uint64_t version_in(const std::byte* header) {
  std::uint64_t v = 0;
  std::memcpy(&v, header, sizeof v);
  return v;
}

// How long the constructor tries to reach a peer (WorkerOptions::connect_within).
Millis connect_bound(const WorkerOptions& o) {
  return o.connect_within > Millis::zero() ? o.connect_within : o.timeout;
}

}  // namespace

struct Worker::State {
  State(const Device& dev, const WorkerOptions& o)
      : device(dev),
        options(o),
        bytes(o.floats * sizeof(float)),
        gradient_buffer(Buffer::allocate(bytes)),
        gradient_region(MemoryRegion::register_buffer(dev, gradient_buffer, Access::local)),
        // [header copy 1][floats][header copy 2]: the three READs of a pull land side by side.
        model_buffer(Buffer::allocate(kHeaderBytes + bytes + kHeaderBytes)),
        model_region(MemoryRegion::register_buffer(dev, model_buffer, Access::local_write)),
        server(connect_with_retry(dev, o.server.address, o.server.port, o.transport, connect_bound(o))),
        aggregator(dev, o, bytes, o.sidecar.has_value()) {}
  ~State() { say_goodbye(); }  // before the connections close
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  Device device;
  WorkerOptions options;
  std::size_t bytes;
  Buffer gradient_buffer;
  MemoryRegion gradient_region;
  Buffer model_buffer;
  MemoryRegion model_region;
  Connection server;
  RegionDescriptor server_slots, server_shard;
  std::optional<Connection> replica;
  RegionDescriptor replica_slots, replica_shard;
  // Direct mode with an aggregator: requests, grants and the one write go there (no mirror:
  // the aggregator's forward is mirrored); pulls stay with the server.
  AggregatorLink aggregator;
  std::uint64_t failovers = 0;
  std::uint64_t failovers_at_pull = 0;              // `failovers` when the last pull read its version
  std::optional<Clock::time_point> failed_over_at;  // the last failover
  std::uint64_t bytes_copied = 0;                   // Worker::bytes_copied()

  Connection& push_target() { return aggregator.up() ? aggregator.connection() : server; }

  // After an error: if the server's connection failed and the replica's is alive, the replica
  // (which promotes itself when it loses the server) is the server from now on; if only the
  // replica failed, go on without mirroring. Returns false when nothing can take over.
  bool recover() {
    if (aggregator.up() && aggregator.connection().failed()) {
      aggregator.drop(aggregator.connection().failure()->what());
      return true;
    }
    if (server.failed() && replica && !replica->failed()) {
      std::fprintf(stderr, "gradlane ps worker %u: server lost (%s); failing over to the replica %s\n", options.id,
                   server.failure()->what(), replica->describe().c_str());
      server = std::move(*replica);
      replica.reset();
      server_slots = replica_slots;
      server_shard = replica_shard;
      ++failovers;
      failed_over_at = Clock::now();
      return true;
    }
    if (!server.failed() && replica && replica->failed()) {
      std::fprintf(stderr, "gradlane ps worker %u: replica lost (%s); pushing to the server only\n", options.id,
                   replica->failure()->what());
      replica.reset();
      return true;
    }
    return false;
  }
  // Sidecar mode: the server sends a worker nothing but where a restarted aggregator listens
  // (ListeningAt); read at each push, without waiting. A failure here is left for the push to
  // meet (its write fails over), as it would be unread otherwise.
  void take_server_notices() {
    if (!sidecar || server.failed()) return;
    try {
      while (auto said = server.try_receive()) {
        const Message message = decode(*said);
        if (std::holds_alternative<Opened>(message)) continue;  // a claim's answer from before a failover
        const auto* at = std::get_if<ListeningAt>(&message);
        if (at == nullptr) {
          throw Error(Errc::protocol, fmt::format("{}: unexpected message (kind {}) from the server in sidecar mode",
                                                  server.describe(), message.index() + 1));
        }
        take_listening_at(*at);
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "gradlane ps worker %u: reading the server's notices: %s\n", options.id, e.what());
    }
  }

  // A replica that joined the running server (the server told us where it listens): we connect
  // to it, announce from which sequence we mirror there (Mirroring, before that write), and
  // fail over to it if the server dies.
  bool announce_mirroring = false;
  void take_listening_at(const ListeningAt& at) {
    if (at.kind == PeerKind::aggregator) return aggregator.heard_of(at);
    // The server adopts a joining replica only when it has none: one announced elsewhere than
    // ours means ours is not the server's any more (it failed; we may not have seen it yet).
    if (replica && !replica->failed() && replica_address == std::pair{at.address, at.port}) return;
    replica_announced = at;
    replica_attempts = 0;
    reach_announced_replica();
  }
  // Tries to reach the announced replica: at once, then again at later pushes (at most
  // kReachAttempts tries, kReachAgainAfter apart), so a joining replica that was slow to
  // answer is not given up on after one try.
  void reach_announced_replica() {
    if (!replica_announced || Clock::now() < next_replica_attempt) return;
    const ListeningAt at = *replica_announced;
    ++replica_attempts;
    try {
      replica.reset();  // an older one, if any: not the server's replica now
      connect_replica(at.address, at.port, kReachAnnouncedWithin);
      announce_mirroring = options.mirror;
      replica_announced.reset();
      std::fprintf(stderr, "gradlane ps worker %u: connected to the replica that joined, %s\n", options.id,
                   replica->describe().c_str());
    } catch (const Error& e) {
      replica.reset();
      const bool again = replica_attempts < kReachAttempts;
      std::fprintf(stderr, "gradlane ps worker %u: the replica that joined (%s:%u) is out of reach (%s): %s\n",
                   options.id, at.address.c_str(), at.port, e.what(),
                   again ? "trying again at a later push" : "going on without it");
      if (!again) replica_announced.reset();
      next_replica_attempt = Clock::now() + kReachAgainAfter;
    }
  }
  std::optional<ListeningAt> replica_announced;
  std::uint32_t replica_attempts = 0;
  Clock::time_point next_replica_attempt{};
  std::pair<std::string, std::uint16_t> replica_address;  // where `replica` is connected
  // How long a worker tries to reach a replica the server announced, and how often and how far
  // apart.
  static constexpr Millis kReachAnnouncedWithin{5000};
  static constexpr std::uint32_t kReachAttempts = 3;
  static constexpr Millis kReachAgainAfter{5000};

  // Connects to a replica (the one we started with, or one that joined), learns its regions,
  // says who we are.
  void connect_replica(const std::string& address, std::uint16_t port, Millis timeout) {
    replica.emplace(connect_with_retry(device, address, port, options.transport, timeout));
    replica_address = {address, port};
    std::tie(replica_slots, replica_shard) = join(*replica, Addressed::replica);
    if (replica_slots.length != server_slots.length) {
      throw Error(Errc::protocol, fmt::format("the replica has {} bytes of slots, the server {}: they must match",
                                              replica_slots.length, server_slots.length));
    }
  }

  // This worker is a sidecar-mode aggregator's forward (write_as): its sequences are a
  // sidecar's, as a sidecar-mode worker's are, though it has no sidecar client of its own.
  bool sidecar_forward = false;

  std::uint32_t slots = 0;
  bool push_in_flight = false;
  std::optional<sidecar::Client> sidecar;  // sidecar mode
  bool warned_redirect = false;            // said once that a redirect had nowhere to go
  std::uint64_t request = 0;               // sidecar mode: the request in flight
  // The push in flight, to ask again for a grant that came too late (grant_lifetime).
  std::uint64_t push_tag = 0;
  std::uint64_t push_computed_on = 0;
  std::uint64_t job_remaining = 0;  // declared with each request (set_job_remaining)
  Clock::time_point requested_at{};
  // Sidecar mode: since when every push was refused as receiver_unreachable / unknown_receiver.
  std::optional<Clock::time_point> refused_since;

  // Asks the server (or the aggregator), or the sidecar, for a grant for the push in flight.
  void send_request() {
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

  // A grant is too old to write once `since` (direct mode: when the worker last saw its queue
  // empty before the grant; sidecar mode: its slot's start) is more than grant_lifetime ago; asks again then, up to
  // kMaxGrantRequests in all. Returns false when the push has asked often enough and is to be reported lost.
  static constexpr std::uint32_t kMaxGrantRequests = 3;
  bool too_late(Clock::time_point since, std::uint32_t& expired) {
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

  // Past this, a grant taken up at `since` (see too_late) is too old to write.
  Clock::time_point write_by(Clock::time_point since) const { return since + options.grant_lifetime; }

  // Whether this push mirrors to a replica.
  bool mirroring() const { return replica && options.mirror; }
  // Grant windows: shows the grant's token to the replica as well, ahead of the mirror (its
  // answer is taken in write()). True if it was sent.
  bool claim_mirror(std::uint64_t sequence, std::uint64_t token) {
    if (token == 0 || !mirroring()) return false;
    replica->send(encode(Claim{sequence, token}));
    return true;
  }
  // Sidecar mode, a server with grant windows: claims the server's slot and the mirror's (their
  // answers are taken in write_claimed). True if the mirror's was sent.
  bool send_claims(std::uint64_t sequence, std::uint64_t token) {
    server.send(encode(Claim{sequence, token}));
    return claim_mirror(sequence, token);
  }

  // Writes the gradient into the slot of `sequence` at the replica, then at the server; in
  // direct mode with an aggregator, into the aggregator's member slot instead. Past `deadline`
  // (the grant's arrival or its slot's start, plus grant_lifetime) nothing more goes to the
  // server: the push is lost, not written (PushResult::sequence 0). A nonzero
  // `window_rkey` (the server's grant windows) opens that slot alone at the server. `token`:
  // the grant's (grant windows), and `mirror_claimed`: the replica was sent a claim for its
  // slot with it (claim_mirror), whose answer opens it.
  PushResult write(std::uint64_t sequence, Clock::time_point deadline, std::uint32_t window_rkey = 0,
                   std::uint64_t token = 0, bool mirror_claimed = false) {
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
    RegionDescriptor mirror_slot{replica_slots.addr + offset, bytes, replica_slots.rkey};
    if (mirrors && mirror_claimed) {  // the replica's answer: a window over its slot for us
      mirror_slot.rkey = await_window(*replica, sequence);
      if (mirror_slot.rkey == 0) return decided_before_claim(sequence, "replica");
    }
    // A payload of at most max_inline bytes is posted inline: the provider copies it into the
    // work request (connection.hpp). Counted per copy written: 1 + mirror.
    if (bytes <= options.transport.max_inline) bytes_copied += bytes * (mirrors ? 2 : 1);
    // The mirror first: if this worker dies between the two, the server never sees the update
    // and skips it, and so does the replica (it applies only what the server decided).
    std::optional<OpId> mirrored;
    if (mirrors && announce_mirroring) {  // a joined replica: ahead of the first mirror, on the same QP
      replica->send(encode(Mirroring{options.id, sequence}));
      announce_mirroring = false;
    }
    if (mirrors) mirrored = replica->write_and_ring(gradient_region, 0, mirror_slot, 0, bytes, imm);
    // The replica's refusal floor, READ behind the mirror on the same QP. A server SIGKILLed a
    // moment ago still has its writes acknowledged by the kernel, while the replica, promoted
    // meanwhile, refuses the mirror (below the floor it took over at): that push would be
    // acknowledged and applied nowhere. Read into a spare word of our header copy, so the two
    // READs do not land on each other.
    constexpr std::size_t kReplicaFloorAt = offsetof(ShardHeader, refuse_below) + sizeof(std::uint64_t);
    static_assert(kReplicaFloorAt + sizeof(std::uint64_t) <= sizeof(ShardHeader));
    if (mirrored) {
      mirrored = replica->read(model_region, kReplicaFloorAt, replica_shard, offsetof(ShardHeader, refuse_below),
                               sizeof(std::uint64_t));
    }
    // Sidecar mode: ours, or the sidecar-mode aggregator's forward (write_as).
    const bool floors = sidecar.has_value() || sidecar_forward;
    // The grant's age once more, right before the server's write. A stall since too_late() — a
    // SIGSTOP delivered as the mirror's post returned; the server may skip the sequence
    // meanwhile, and the late write would still be acknowledged here — may have outlived
    // the server's hole_timeout (sidecar mode: its skip of a stuck head, which a floor READ
    // does not show). Between this clock read and the post there is only the provider's work
    // request left; grant windows close even that (a claim).
    if (Clock::now() > deadline) {
      if (mirrored) replica->wait(*mirrored, options.timeout);  // held there until the server's skip
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
    const OpId written = window_rkey == 0
                             ? server.write_and_ring(gradient_region, 0, server_slots, offset, bytes, imm)
                             : server.write_and_ring(gradient_region, 0,
                                                     {server_slots.addr + offset, bytes, window_rkey}, 0, bytes, imm);
    // Sidecar mode: the server's refusal floor, READ behind the write on the same QP (so it
    // completes after it, and waiting for it waits for the write).
    constexpr std::size_t kFloorAt = offsetof(ShardHeader, refuse_below);
    const OpId last_on_server =
        floors ? server.read(model_region, kFloorAt, server_shard, kFloorAt, sizeof(std::uint64_t)) : written;
    if (mirrored) replica->wait(*mirrored, options.timeout);
    server.wait(last_on_server, options.timeout);
    PushResult result;
    result.sequence = sequence;
    result.wire_time = Clock::now() - start;
    if (floors && refused_below_floor(sequence, kFloorAt)) result.lost = true;
    if (mirrored && refused_below_floor(sequence, kReplicaFloorAt)) result.lost = true;
    return result;
  }

  // Sidecar mode: a server that took a sequence over — a promoted replica, or a server whose
  // gradlaned was restarted — refuses the sequences the old owner may have granted (ps.hpp),
  // silently, as a doorbell has no answer. Its header says from where on it takes them; READ
  // after our write on the same QP, it reflects at least the moment our write arrived (the
  // takeover publishes it before taking the doorbells already there). A refused push is lost,
  // not acknowledged. Read on every push: a worker cannot know whether its server took its own
  // sequence over (at a restarted gradlaned).
  // `at`: where in our header copy the floor was READ.
  bool refused_below_floor(std::uint64_t sequence, std::size_t at) const { return sequence < header_copy_word(at); }
  // A word of our copy of a shard header, where a READ of one header word landed.
  std::uint64_t header_copy_word(std::size_t at) const {
    std::uint64_t word = 0;
    std::memcpy(&word, model_buffer.data() + at, sizeof word);
    return word;
  }

  // Whether the server has decided `sequence` already: before its write, that means skipped
  // (a sequence is applied only after its write arrived). Writing it then would be refused, or
  // land in the slot a sequence `slots` later may be using. One 8-byte READ of the header's
  // count of decided sequences (stage: the local copy of the header, which pulls overwrite).
  // A stall between this READ and the write is not covered (the write is then refused and
  // reported as written).
  bool server_decided(std::uint64_t sequence) {
    constexpr std::size_t kAt = offsetof(ShardHeader, model_version);
    server.wait(server.read(model_region, kAt, server_shard, kAt, sizeof(std::uint64_t)), options.timeout);
    return sequence <= header_copy_word(kAt);
  }

  // Writes the gradient into member slot `slot` of the aggregator's ring, doorbell `imm`.
  PushResult write_member(std::uint64_t slot, std::uint32_t imm) {
    const auto start = Clock::now();
    if (bytes <= options.transport.max_inline) bytes_copied += bytes;
    Connection& conn = aggregator.connection();
    conn.wait(conn.write_and_ring(gradient_region, 0, aggregator.ring(), slot * bytes, bytes, imm), options.timeout);
    PushResult result;
    result.wire_time = Clock::now() - start;
    result.pending = true;
    return result;
  }

  // Sidecar mode: a go (to the server) or a redirect (to the aggregator), completed with the
  // sidecar either way, failed if the write threw.
  PushResult write_granted(const sidecar::Grant& g) {
    if (g.part_count != 1) {
      sidecar->complete(g.request, g.part_index, std::chrono::nanoseconds{0}, /*failed=*/true);
      throw Error(Errc::invalid_argument,
                  fmt::format("the sidecar split the {}-byte update into {} parts: a shard must fit one part "
                              "(at most the sidecar's partition size); use more, smaller shards",
                              bytes, g.part_count));
    }
    const bool redirect = g.kind == sidecar::GrantKind::redirect;
    if (redirect && (!aggregator.up() || g.target != options.aggregator_endpoint)) {
      // Nowhere to write it: the sidecar hears it failed (the aggregate goes on without it).
      sidecar->complete(g.request, g.part_index, std::chrono::nanoseconds{0}, /*failed=*/true);
      if (!warned_redirect) {
        std::fprintf(stderr,
                     "gradlane ps worker %u: the sidecar redirected an update to aggregator endpoint %u, %s; "
                     "reported lost\n",
                     options.id, g.target,
                     aggregator.up() ? "not the one this worker is connected to" : "and this worker has no aggregator");
        warned_redirect = true;
      }
      return lost_push();
    }
    PushResult result;
    try {
      // A server with grant windows: its token goes out now (to the replica too), so the
      // claims' round trips run while we wait for the slot.
      const bool claims = !redirect && g.token != 0;
      const bool mirror_claimed = claims && send_claims(g.sequence, g.token);
      wait_for_slot(g.slot_start);
      const Clock::time_point deadline = write_by(Clock::time_point(g.slot_start));
      // A member's slot at the aggregator is its aggregate id modulo the worker's slots there;
      // the doorbell carries the id's low 32 bits, the same modulo there.
      const auto id32 = static_cast<std::uint32_t>(g.sequence);
      result = redirect ? write_member(aggregator.slot_of(id32), id32)
               : claims ? write_claimed(g.sequence, deadline, g.token, mirror_claimed)
                        : write(g.sequence, deadline);
    } catch (const Error&) {
      sidecar->complete(g.request, g.part_index, std::chrono::nanoseconds{0}, /*failed=*/true);
      throw;
    }
    if (redirect) {
      result.aggregate = g.sequence;
      aggregator.took(g.sequence, push_tag);
    }
    // Not written (stalled past the grant before the server's write): failed, so the sidecar
    // cancels the sequence and the server skips it now if it has not yet.
    const bool unwritten = !redirect && result.lost && result.sequence == 0;
    sidecar->complete(g.request, g.part_index, result.wire_time, /*failed=*/unwritten);
    return result;
  }

  // Sidecar mode, a server with grant windows: the claim of `sequence` went out (and, if
  // `mirror_claimed`, the replica's); the server's answer is the key of a window over that one
  // slot on our connection, then we write. Window 0: the server decided that sequence already
  // (skipped it: our grant came too late), so the push is lost, not written.
  PushResult write_claimed(std::uint64_t sequence, Clock::time_point deadline, std::uint64_t token,
                           bool mirror_claimed) {
    const std::uint32_t window_rkey = await_window(server, sequence);
    if (window_rkey != 0) return write(sequence, deadline, window_rkey, token, mirror_claimed);
    if (mirror_claimed) (void)await_window(*replica, sequence);  // not left for the next push to read
    return decided_before_claim(sequence, "server");
  }

  // The answer to a claim of `sequence` on `conn` (a server's or a replica's): the key that
  // opens its slot to us, or 0 when it decided that sequence already. An answer to another
  // claim is one from before a failover (a mirror's claim, its replica since promoted): passed.
  std::uint32_t await_window(Connection& conn, std::uint64_t sequence) {
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

  PushResult decided_before_claim(std::uint64_t sequence, const char* where) const {
    std::fprintf(stderr,
                 "gradlane ps worker %u: the %s had decided sequence %llu before our claim: not written, "
                 "reported lost\n",
                 options.id, where, static_cast<unsigned long long>(sequence));
    return lost_push();
  }

  // Direct mode: the next message on `target`, and when its receive queue was last seen empty
  // before it (at the latest, the request): the message arrived after that, so this bounds how
  // long it waited here unread — the worker stalled, or the app took its time between
  // start_push() and wait_push() — on this host's clock alone. Neither a slow server nor a
  // grant that waited there for a free slot counts.
  std::pair<Message, Clock::time_point> receive_noting_arrival(Connection& target) {
    const auto start = Clock::now();
    Clock::time_point last_empty = requested_at, last_probe = start;
    for (;;) {
      if (auto message = target.try_receive()) return {decode(*message), last_empty};
      last_empty = Clock::now();
      const auto waited = last_empty - start;
      if (waited > options.timeout) {
        throw Error(Errc::timeout,
                    fmt::format("{}: no grant within {} ms", target.describe(), options.timeout.count()));
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

  PushResult wait_direct() {
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

  static PushResult lost_push() {
    PushResult lost;
    lost.lost = true;
    return lost;
  }
  // Within failover_patience of this worker's last failover.
  bool failing_over() const { return failed_over_at && Clock::now() - *failed_over_at < options.failover_patience; }

  // The server refused the request: computed on a version it has not reached. After a failover
  // the model came from a server that got further than its promoted replica: the push did not
  // happen, the caller pulls the new server's model. Otherwise the application's error.
  PushResult refused_push(const Connection& target, const Refused& refused) {
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

  static PushResult expired_push(std::uint32_t expired) {
    PushResult lost = lost_push();
    lost.expired_grants = expired;
    return lost;
  }

  PushResult wait_sidecar() {
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

  // The model was pulled from a server that died since, which had applied updates its replica
  // had not yet when it was promoted (up to the replica bound): the version is ahead of the new
  // server's. Or it was pulled from the promoted replica while the sidecar still hands out the
  // dead server's sequence (its Takeover on the way). Either way the push did not happen; the
  // caller pulls the new server's model and goes on. Or the receiver's sidecar was restarted and
  // answered before it held its surviving server's sequence. Refused so for failover_patience
  // without a failover, it is the application's error.
  PushResult from_the_future() {
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
  std::optional<Clock::time_point> future_since;  // since when every push was refused so

  PushResult take_sidecar_answer(const sidecar::Grant& g) {
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

  // Tells every peer this worker finished, so that its disconnect counts as a leave, not a
  // loss. Bounded: a peer that does not acknowledge within a second is left to its timeouts.
  void say_goodbye() noexcept {
    if (push_in_flight) return;  // a push started and never waited for: not finished
    std::vector<Connection*> told{&server, replica ? &*replica : nullptr};
    for (Connection* conn : aggregator.to_tell_bye()) told.push_back(conn);
    for (Connection* conn : told) {
      if (conn == nullptr || conn->failed()) continue;
      try {
        conn->send(encode(Bye{options.id}));
        conn->flush(std::chrono::seconds(1));  // in the peer's queue before our disconnect
      } catch (const std::exception&) {
        // It goes on as a lost peer there.
      }
    }
  }

  // Learns a shard's regions on `conn` and says who we are.
  std::pair<RegionDescriptor, RegionDescriptor> join(Connection& conn, Addressed as) {
    const RegionDescriptor ring = conn.wait_region(kSlotRegionId, options.timeout);
    const RegionDescriptor shard = conn.wait_region(kShardRegionId, options.timeout);
    if (ring.length == 0 || ring.length % bytes != 0 || shard.length != kHeaderBytes + bytes) {
      throw Error(Errc::protocol,
                  fmt::format("{}: the shard's regions do not fit a shard of {} floats (ring {} bytes, shard {} "
                              "bytes): are worker and server configured with the same model?",
                              conn.describe(), options.floats, ring.length, shard.length));
    }
    conn.send(encode(Hello{PeerKind::worker, options.id, as}));
    return {ring, shard};
  }
};

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
  if (options.sidecar) {
    sidecar::AttachOptions attach = *options.sidecar;
    attach.region_bytes = s.bytes;
    s.sidecar.emplace(sidecar::Client::attach(attach));
  }
  if (options.replica) s.connect_replica(options.replica->address, options.replica->port, connect_bound(options));
  if (options.aggregator) {
    s.aggregator.connect(connect_bound(options));
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
  s.reach_announced_replica();
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
      return s.wait_sidecar();
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
    // Header, payload, header on one QP: the responder executes them in order, so the payload
    // was read between the two version reads. Only the last is waited for (RC completes in order).
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
    if (consistent_snapshot(v1, v2)) {
      s.failovers_at_pull = s.failovers;
      return {v1 / 2, attempt};
    }
  }
  throw Error(Errc::timeout, fmt::format("pull from {}: the shard was mid-apply in {} consecutive reads",
                                         s.server.describe(), kMaxPullAttempts));
}

std::uint64_t Worker::server_version() {
  State& s = *state_;
  for (;;) {
    try {
      s.server.wait(s.server.read(s.model_region, 0, s.server_shard, 0, kHeaderBytes), s.options.timeout);
      // An odd word means an apply is running: the updates finished are the ones before it.
      return version_in(s.model_buffer.data()) / 2;
    } catch (const Error&) {
      if (!s.recover()) throw;
    }
  }
}

PushResult Worker::write_as(std::uint64_t sequence, std::uint64_t token) {
  State& s = *state_;
  // No grant age here: the forward goes out once its members are in, which may be past any
  // grant_lifetime (aggregator_sidecar.cpp); what it asks the server instead is below.
  constexpr Clock::time_point kNoDeadline = Clock::time_point::max();
  try {
    s.sidecar_forward = true;
    if (token != 0) {  // the claim's answer says whether the server decided it already
      const bool mirror_claimed = s.send_claims(sequence, token);
      return s.write_claimed(sequence, kNoDeadline, token, mirror_claimed);
    }
    if (s.server_decided(sequence)) {
      std::fprintf(stderr,
                   "gradlane ps worker %u: the server skipped sequence %llu before it was written: not "
                   "written, reported lost\n",
                   s.options.id, static_cast<unsigned long long>(sequence));
      return State::lost_push();
    }
    return s.write(sequence, kNoDeadline);
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
