// Worker::State, its connections: construction, failing over to the replica, what the server
// announces, joining a shard, and the goodbye that makes a disconnect a leave.
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
      replica(dev, o, [this](Connection& conn) { return join(conn, Addressed::replica); }),
      aggregator(dev, o, bytes, o.sidecar.has_value()) {}

bool Worker::State::recover() {
  if (aggregator.up() && aggregator.connection().failed()) {
    aggregator.drop(aggregator.connection().failure()->what());
    return true;
  }
  if (server.failed() && replica.up() && !replica.connection().failed()) {
    std::fprintf(stderr, "gradlane ps worker %u: server lost (%s); failing over to the replica %s\n", options.id,
                 server.failure()->what(), replica.connection().describe().c_str());
    ReplicaLink::AsServer promoted = replica.take_as_server();
    server = std::move(promoted.conn);
    server_slots = promoted.slots;
    server_shard = promoted.shard;
    ++failovers;
    failed_over_at = Clock::now();
    return true;
  }
  if (!server.failed() && replica.up() && replica.connection().failed()) {
    std::fprintf(stderr, "gradlane ps worker %u: replica lost (%s); pushing to the server only\n", options.id,
                 replica.connection().failure()->what());
    replica.drop();
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
  replica.heard_of(at, server_slots.length);
}

void Worker::State::say_goodbye() noexcept {
  if (push_in_flight) return;  // a push started and never waited for: not finished
  std::vector<Connection*> told{&server, replica.up() ? &replica.connection() : nullptr};
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
