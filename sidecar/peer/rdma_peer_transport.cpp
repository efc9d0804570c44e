#include "sidecar/peer/rdma_peer_transport.hpp"

#include <charconv>
#include <cstdio>
#include <fmt/format.h>
#include <thread>

namespace gradlane::peer {

PeerAddress parse_peer_address(const std::string& text) {
  const auto colon = text.rfind(':');
  unsigned port = 0;
  if (colon == std::string::npos || colon == 0) {
    throw Error(Errc::invalid_argument, fmt::format("peer '{}' is not ADDRESS:PORT", text));
  }
  const char* first = text.data() + colon + 1;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, port);
  if (ec != std::errc() || end != last || port == 0 || port > 65535) {
    throw Error(Errc::invalid_argument, fmt::format("peer '{}' has no valid port (1..65535)", text));
  }
  return {text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

RdmaPeerTransport::RdmaPeerTransport(const Device& device, std::uint16_t listen_port,
                                     const std::vector<PeerAddress>& connect_to, std::size_t expect_inbound,
                                     std::chrono::milliseconds timeout, const TransportOptions& options,
                                     std::chrono::milliseconds stall_limit)
    : stall_limit_(stall_limit), redialer_(device, options, kRedialEvery) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  listener_.emplace(device, listen_port, options);
  for (const auto& peer : connect_to) {
    for (;;) {
      try {
        add_link(connect(device, peer.address, peer.port, options), peer);
        break;
      } catch (const Error& e) {
        // Nothing listening yet: that peer's gradlaned is still starting. Anything else is real.
        if (e.code() != Errc::connection_rejected || std::chrono::steady_clock::now() > deadline) {
          throw Error(e.code(), fmt::format("connecting to peer sidecar {}:{}: {}", peer.address, peer.port, e.what()));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }
  for (std::size_t i = 0; i < expect_inbound; ++i) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      add_link(listener_->accept(std::max(left, std::chrono::milliseconds(1))), std::nullopt);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("waiting for {} more peer sidecar(s) to connect to port {}: {}",
                                        expect_inbound - i, listener_->port(), e.what()));
    }
  }
}

PeerIndex RdmaPeerTransport::add_link(Connection connection, std::optional<PeerAddress> dialed) {
  links_.emplace_back(std::move(connection), std::move(dialed));
  const auto index = static_cast<PeerIndex>(links_.size() - 1);
  live_.push_back(index);
  return index;
}

void RdmaPeerTransport::mark_failed(PeerIndex peer, const Error& error) {
  Link& link = links_[peer];
  if (!link.failed) {
    link.failed = true;
    std::fprintf(stderr, "gradlaned: link to peer %s failed: %s\n", describe(peer).c_str(), error.what());
    if (link.dialed) redialer_.redial(*link.dialed);
  }
}

void RdmaPeerTransport::drain(PeerIndex peer) {
  Link& link = links_[peer];
  try {
    while (!link.failed && !link.queued.empty()) {
      if (!link.connection->try_send(link.queued.front())) {
        // The clock is read only while stuck: posting stays free of clock reads.
        const auto now = std::chrono::steady_clock::now();
        if (!link.stalled_since) link.stalled_since = now;
        if (now - *link.stalled_since > stall_limit_) {
          mark_failed(peer,
                      Error(Errc::timeout, fmt::format("{} message(s) could not be posted for {} ms: the peer stopped "
                                                       "acknowledging (stopped or overloaded)",
                                                       link.queued.size(), stall_limit_.count())));
        }
        return;
      }
      link.queued.pop_front();
      link.stalled_since.reset();
    }
  } catch (const Error& e) {
    mark_failed(peer, e);
  }
}

bool RdmaPeerTransport::send(PeerIndex peer, std::span<const std::byte> message) {
  Link& link = links_.at(peer);
  if (link.failed) return false;
  if (link.queued.size() >= kMaxQueued) {
    mark_failed(peer,
                Error(Errc::resource_exhausted,
                      fmt::format("{} messages queued and none taken: the peer stopped acknowledging", kMaxQueued)));
    return false;
  }
  link.queued.emplace_back(message.begin(), message.end());
  drain(peer);
  return !link.failed;
}

std::optional<std::pair<PeerIndex, std::vector<std::byte>>> RdmaPeerTransport::receive() {
  for (std::size_t i = 0; i < live_.size(); ++i) {
    const std::size_t at = (next_ + i) % live_.size();
    const PeerIndex p = live_[at];
    Link& link = links_[p];
    drain(p);
    if (link.failed) continue;
    try {
      if (auto message = link.connection->try_receive()) {
        next_ = (at + 1) % live_.size();
        return std::pair{p, std::move(*message)};
      }
    } catch (const Error& e) {
      mark_failed(p, e);
    }
  }
  return std::nullopt;
}

std::vector<PeerIndex> RdmaPeerTransport::take_failed() {
  std::vector<PeerIndex> failed;
  for (const PeerIndex p : live_) {
    Link& link = links_[p];
    if (link.failed && !link.reported) {
      link.reported = true;
      link.connection.reset();  // its QP and rings: nothing reads or writes them any more
      link.queued = {};
      failed.push_back(p);
    }
  }
  std::erase_if(live_, [&](PeerIndex p) { return links_[p].reported; });
  if (next_ >= live_.size()) next_ = 0;
  return failed;
}

std::vector<PeerIndex> RdmaPeerTransport::take_joined() {
  if (++polls_ % kPollsPerAdmission != 0) return {};
  std::vector<PeerIndex> joined;
  try {
    while (auto connection = listener_->try_accept()) {
      joined.push_back(add_link(std::move(*connection), std::nullopt));
      std::fprintf(stderr, "gradlaned: peer %s connected\n", describe(joined.back()).c_str());
    }
  } catch (const Error& e) {
    // A connect request that failed half-way (the peer died again, a stray): that one only.
    std::fprintf(stderr, "gradlaned: a peer sidecar's connect request failed: %s\n", e.what());
  }
  for (auto& [address, connection] : redialer_.take()) {
    joined.push_back(add_link(std::move(connection), address));
    std::fprintf(stderr, "gradlaned: reconnected to peer sidecar %s:%u (%s)\n", address.address.c_str(),
                 static_cast<unsigned>(address.port), describe(joined.back()).c_str());
  }
  return joined;
}

std::string RdmaPeerTransport::describe(PeerIndex peer) const { return links_.at(peer).description; }

}  // namespace gradlane::peer
