// How sidecars reach each other: a small message transport the distributed policy talks
// through. Production uses RDMA SEND/RECV over gradlane Connections (rdma_peer_transport);
// tests use an in-memory pair, so the slot-agreement logic is testable without a NIC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace gradlane::peer {

using PeerIndex = std::uint32_t;

class PeerTransport {
 public:
  PeerTransport() = default;
  PeerTransport(const PeerTransport&) = delete;
  PeerTransport& operator=(const PeerTransport&) = delete;
  virtual ~PeerTransport() = default;

  virtual std::size_t peer_count() const = 0;
  // Queues one message to `peer`. Returns false when the link to that peer has failed (the
  // peer is then gone for good; its state must be cleaned up by the caller).
  virtual bool send(PeerIndex peer, std::span<const std::byte> message) = 0;
  // The next message from any peer, without waiting.
  virtual std::optional<std::pair<PeerIndex, std::vector<std::byte>>> receive() = 0;
  // Peers whose link failed since the last call (each reported once).
  virtual std::vector<PeerIndex> take_failed() = 0;
  // Peers that connected after start-up since the last call (a restarted sidecar coming back:
  // each gets a new index, peer_count() grows; the old index stays failed).
  virtual std::vector<PeerIndex> take_joined() { return {}; }
  virtual std::string describe(PeerIndex peer) const = 0;
};

}  // namespace gradlane::peer
