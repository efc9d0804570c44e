// ReplicaLink (replica_link.hpp).
#include "ps/worker/replica_link.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <tuple>

#include "ps/protocol/regions.hpp"

namespace gradlane::ps {

ReplicaLink::ReplicaLink(const Device& device, const WorkerOptions& options, Join join)
    : device_(device),
      worker_(options.id),
      mirror_(options.mirror),
      transport_(options.transport),
      join_(std::move(join)) {}

void ReplicaLink::connect(const std::string& address, std::uint16_t port, Millis timeout, std::uint64_t ring_bytes) {
  conn_.emplace(connect_with_retry(device_, address, port, transport_, timeout));
  address_ = {address, port};
  std::tie(slots_, shard_) = join_(*conn_);
  if (slots_.length != ring_bytes) {
    throw Error(Errc::protocol, fmt::format("the replica has {} bytes of slots, the server {}: they must match",
                                            slots_.length, ring_bytes));
  }
}

void ReplicaLink::heard_of(const ListeningAt& at, std::uint64_t ring_bytes) {
  if (conn_ && !conn_->failed() && address_ == std::pair{at.address, at.port}) return;
  announced_ = at;
  attempts_ = 0;
  reach_announced(ring_bytes);
}

void ReplicaLink::reach_announced(std::uint64_t ring_bytes) {
  if (!announced_ || Clock::now() < next_attempt_) return;
  const ListeningAt at = *announced_;
  ++attempts_;
  try {
    conn_.reset();  // an older one, if any: not the server's replica now
    connect(at.address, at.port, kReachAnnouncedWithin, ring_bytes);
    announce_ = mirror_;
    announced_.reset();
    std::fprintf(stderr, "gradlane ps worker %u: connected to the replica that joined, %s\n", worker_,
                 conn_->describe().c_str());
  } catch (const Error& e) {
    conn_.reset();
    const bool again = attempts_ < kReachAttempts;
    std::fprintf(stderr, "gradlane ps worker %u: the replica that joined (%s:%u) is out of reach (%s): %s\n", worker_,
                 at.address.c_str(), at.port, e.what(), again ? "trying again at a later push" : "going on without it");
    if (!again) announced_.reset();
    next_attempt_ = Clock::now() + kReachAgainAfter;
  }
}

ReplicaLink::AsServer ReplicaLink::take_as_server() {
  AsServer promoted{std::move(*conn_), slots_, shard_};
  conn_.reset();
  return promoted;
}

}  // namespace gradlane::ps
