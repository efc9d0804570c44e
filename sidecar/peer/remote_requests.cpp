#include "sidecar/peer/remote_requests.hpp"

#include <fmt/format.h>

namespace gradlane::peer {

RemoteRequests::Pending RemoteRequests::pending(PeerIndex peer) const {
  const auto it = pending_.find(peer);
  return it == pending_.end() ? Pending{} : it->second;
}

bool RemoteRequests::admits(PeerIndex peer, std::uint64_t bytes) const {
  const Pending p = pending(peer);
  return bytes <= max_request_bytes_ && p.requests < max_pending_ &&
         bytes <= max_pending_bytes_ - p.bytes;  // p.bytes never exceeds the bound
}

std::string RemoteRequests::refusal(PeerIndex peer, std::uint64_t bytes) const {
  const Pending p = pending(peer);
  return fmt::format(
      "asked for {} bytes with {} requests ({} bytes) pending here: requests over {} bytes, or past {} requests or {} "
      "bytes pending, are dropped",
      bytes, p.requests, p.bytes, max_request_bytes_, max_pending_, max_pending_bytes_);
}

void RemoteRequests::add(std::uint64_t ours, const Request& request) {
  requests_[ours] = request;
  Pending& p = pending_[request.peer];
  ++p.requests;
  p.bytes += request.bytes;
}

void RemoteRequests::forget(std::uint64_t ours) {
  const auto it = requests_.find(ours);
  if (it == requests_.end()) return;
  Pending& p = pending_[it->second.peer];
  --p.requests;
  p.bytes -= it->second.bytes;
  requests_.erase(it);
}

}  // namespace gradlane::peer
