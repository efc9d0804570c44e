// RemoteRequests: the peers' requests this sidecar's scheduler holds, by the id given them
// here, and the bounds on what one peer may have pending at once (requests, and bytes, which
// become parts in the scheduler), so a hostile or broken peer cannot grow this daemon's memory
// without bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "sidecar/peer/peer_transport.hpp"

namespace gradlane::peer {

// A peer's requests this sidecar holds at once, at most: what a peer's gradlaned lets its apps
// have outstanding at its defaults (64 apps x 4,096), so an honest peer never meets it.
inline constexpr std::size_t kMaxPendingPerPeer = 64 * 4096;
// The same for bytes: one request at most what a gradlaned lets an app request
// (DaemonConfig::max_update_bytes, 16 GiB), and a peer's pending requests together what its
// apps may have owed at its defaults (64 apps x 256 GiB).
inline constexpr std::uint64_t kMaxPeerRequestBytes = std::uint64_t{16} << 30;
inline constexpr std::uint64_t kMaxPendingBytesPerPeer = 64 * (std::uint64_t{256} << 30);

class RemoteRequests {
 public:
  struct Request {
    PeerIndex peer = 0;
    std::uint64_t their_id = 0;
    std::uint64_t bytes = 0;
  };

  // Whether `peer` may add a request of `bytes` now.
  bool admits(PeerIndex peer, std::uint64_t bytes) const;
  // Why it may not: what it asked, what it has pending, and the bounds.
  std::string refusal(PeerIndex peer, std::uint64_t bytes) const;
  void add(std::uint64_t ours, const Request& request);
  bool contains(std::uint64_t ours) const { return requests_.contains(ours); }
  const Request& at(std::uint64_t ours) const { return requests_.at(ours); }
  void forget(std::uint64_t ours);

  void limit_requests(std::size_t per_peer) { max_pending_ = per_peer; }
  void limit_bytes(std::uint64_t request, std::uint64_t per_peer) {
    max_request_bytes_ = request;
    max_pending_bytes_ = per_peer;
  }

 private:
  struct Pending {
    std::size_t requests = 0;
    std::uint64_t bytes = 0;
  };
  Pending pending(PeerIndex peer) const;

  std::unordered_map<std::uint64_t, Request> requests_;  // by our RequestId
  std::map<PeerIndex, Pending> pending_;                 // per peer: what requests_ holds of it
  std::size_t max_pending_ = kMaxPendingPerPeer;
  std::uint64_t max_request_bytes_ = kMaxPeerRequestBytes;
  std::uint64_t max_pending_bytes_ = kMaxPendingBytesPerPeer;
};

}  // namespace gradlane::peer
