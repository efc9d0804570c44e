// Worker::State, its connections: construction, failing over to the replica, a replica the
// server announces, joining a shard, and the goodbye that makes a disconnect a leave.
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

namespace gradlane::ps {

Millis Worker::State::connect_bound(const WorkerOptions& o) {
  return o.connect_within > Millis::zero() ? o.connect_within : o.timeout;
}

Worker::State::State(const Device& dev, const WorkerOptions& o)
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

bool Worker::State::recover() {
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

void Worker::State::take_server_notices() {
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

void Worker::State::take_listening_at(const ListeningAt& at) {
  if (at.kind == PeerKind::aggregator) return aggregator.heard_of(at);
  // The server adopts a joining replica only when it has none: one announced elsewhere than
  // ours means ours is not the server's any more (it failed; we may not have seen it yet).
  if (replica && !replica->failed() && replica_address == std::pair{at.address, at.port}) return;
  replica_announced = at;
  replica_attempts = 0;
  reach_announced_replica();
}

void Worker::State::reach_announced_replica() {
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

void Worker::State::connect_replica(const std::string& address, std::uint16_t port, Millis timeout) {
  replica.emplace(connect_with_retry(device, address, port, options.transport, timeout));
  replica_address = {address, port};
  std::tie(replica_slots, replica_shard) = join(*replica, Addressed::replica);
  if (replica_slots.length != server_slots.length) {
    throw Error(Errc::protocol, fmt::format("the replica has {} bytes of slots, the server {}: they must match",
                                            replica_slots.length, server_slots.length));
  }
}

void Worker::State::say_goodbye() noexcept {
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

std::pair<RegionDescriptor, RegionDescriptor> Worker::State::join(Connection& conn, Addressed as) {
  const RegionDescriptor ring = conn.wait_region(kSlotRegionId, options.timeout);
  const RegionDescriptor shard = conn.wait_region(kShardRegionId, options.timeout);
  if (ring.length == 0 || ring.length % bytes != 0 || shard.length != kHeaderBytes + bytes) {
    throw Error(Errc::protocol,
                fmt::format("{}: the shard's regions do not fit a shard of {} floats (ring {} bytes, shard {} "
                            "bytes): are worker and server configured with the same model?",
                            conn.describe(), options.floats, ring.length, shard.length));
  }
  // The shard's tensor, READ from its header before anything is written: a worker configured
  // for another tensor of the model would have its gradient applied to this one.
  constexpr std::size_t kTensorAt = offsetof(ShardHeader, tensor);
  conn.wait(conn.read(model_region, kTensorAt, shard, kTensorAt, sizeof(std::uint64_t)), options.timeout);
  if (const std::uint64_t held = header_copy_word(kTensorAt); held != options.tensor) {
    throw Error(
        Errc::invalid_argument,
        fmt::format("{}: the {} there holds tensor {}, this worker pushes tensor {} (WorkerOptions::tensor): "
                    "give the worker the tensor of the shard it pushes to (ShardOptions::tensor)",
                    conn.describe(), as == Addressed::server ? "shard" : "replica's shard", held, options.tensor));
  }
  conn.send(encode(Hello{PeerKind::worker, options.id, as}));
  return {ring, shard};
}

}  // namespace gradlane::ps
