// The production PeerTransport: one gradlane Connection per peer sidecar, control messages
// over RDMA SEND/RECV.
//
// Links are made once at start-up: the sidecar listens on its device's address, connects to
// every peer it is told about (retrying until they listen), and accepts the peers that are told
// about it. So a mesh needs each pair configured on one side only, and start order does not
// matter: a connect request waits in the listener's backlog until the other side accepts.
//
// After start-up the listener stays open: a peer sidecar that restarts (and connects again, as
// its --peer says) is accepted without waiting, one look at the listener every
// kPollsPerAdmission calls of take_joined() (a connect completes on the look after the one that
// answered it), and gets a new index. The other way round, a link this sidecar made (to a
// --peer) that fails is made again in the background (Redialer, every kRedialEvery) for as long
// as the sidecar runs: a restarted peer that listens is reached again, and take_joined()
// reports the new link like an accepted one.
//
// A failed link, once take_failed() reported it, keeps its index (a tombstone: its
// description) but gives its QP, rings and queued messages back, and no call looks at it
// again: a peer that keeps reconnecting costs an index each time, not a connection.
//
// Never blocking the daemon: send() only queues. Queued messages are posted (try_send) as
// control slots free up, from send() and receive(); a peer that stopped acknowledging (a
// stopped process: its receive queue fills and RDMA retries its RNR NAKs forever) delays only
// its own messages, and once none of them could be posted for `stall_limit` its link is
// declared failed, like a dead one.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "gradlane/connection.hpp"
#include "sidecar/peer/peer_transport.hpp"
#include "sidecar/peer/redialer.hpp"

namespace gradlane::peer {

// "198.18.0.10:7600" → {address, port}; throws Error(invalid_argument) naming the text.
PeerAddress parse_peer_address(const std::string& text);

class RdmaPeerTransport final : public PeerTransport {
 public:
  RdmaPeerTransport(const Device& device, std::uint16_t listen_port, const std::vector<PeerAddress>& connect_to,
                    std::size_t expect_inbound, std::chrono::milliseconds timeout, const TransportOptions& options,
                    std::chrono::milliseconds stall_limit = kDefaultStallLimit);

  // How long a peer may leave every queued message unposted before its link is failed.
  static constexpr std::chrono::milliseconds kDefaultStallLimit{5000};
  // Messages queued for one peer beyond which its link is failed (bounded memory).
  static constexpr std::size_t kMaxQueued = 4096;

  std::size_t peer_count() const override { return links_.size(); }
  // Links that hold a connection: not failed, or failed and not yet reported.
  std::size_t live_links() const noexcept { return live_.size(); }
  bool send(PeerIndex peer, std::span<const std::byte> message) override;
  std::optional<std::pair<PeerIndex, std::vector<std::byte>>> receive() override;
  std::vector<PeerIndex> take_failed() override;
  std::vector<PeerIndex> take_joined() override;
  std::string describe(PeerIndex peer) const override;

  // take_joined() calls between two looks at the listener (each a non-blocking read of the
  // rdma_cm channel): the daemon's loop calls it every pass, up to ~10,000 times a second idle.
  static constexpr std::uint32_t kPollsPerAdmission = 16;
  // Between two attempts to reconnect to a lost --peer.
  static constexpr std::chrono::milliseconds kRedialEvery{500};

 private:
  struct Link {
    Link(Connection c, std::optional<PeerAddress> to)
        : connection(std::move(c)), description(connection->describe()), dialed(std::move(to)) {}
    std::optional<Connection> connection;  // released once its failure was reported
    std::string description;
    std::optional<PeerAddress> dialed;          // the --peer this sidecar connected to (none: accepted)
    std::deque<std::vector<std::byte>> queued;  // accepted by send(), not yet posted
    std::optional<std::chrono::steady_clock::time_point> stalled_since;  // first failed post
    bool failed = false;
    bool reported = false;
  };
  void mark_failed(PeerIndex peer, const Error& error);
  PeerIndex add_link(Connection connection, std::optional<PeerAddress> dialed);
  // Posts what `peer`'s control slots take now; fails the link once it stalled too long.
  void drain(PeerIndex peer);

  std::chrono::milliseconds stall_limit_;
  std::optional<Listener> listener_;
  std::vector<Link> links_;
  std::vector<PeerIndex> live_;  // the links holding a connection, in index order
  std::size_t next_ = 0;         // round-robin start in live_, so one chatty peer cannot starve the others
  std::uint32_t polls_ = 0;
  Redialer redialer_;  // last: its threads stop before the links go
};

}  // namespace gradlane::peer
