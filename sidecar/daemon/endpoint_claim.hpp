// EndpointClaims: at most one gradlaned serves an endpoint on a host. Two would both hand out
// the endpoint's sequence numbers, and its server would apply two streams as one.
//
// Each --endpoint is claimed by binding an abstract Unix socket named after it. The kernel
// releases the name when the process dies, however it dies, so a crash leaves nothing stale
// for a restart to clean up, and no file can be planted in its place. A second claim fails
// naming the holder's pid and uid, read from the socket's peer credentials. The scope is the
// network namespace: one host, or one emulated host. Any local user may bind an abstract name,
// so a squatter can keep gradlaned from starting (it is named, uid included); it cannot make
// two daemons serve one endpoint.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/unique_fd.hpp"

namespace gradlane::sidecar {

class EndpointClaims {
 public:
  // Claims every endpoint, or none: throws Error(invalid_argument) naming the endpoint and the
  // pid and uid of the process that holds it, Error(system) if a socket call fails otherwise.
  static EndpointClaims acquire(std::span<const std::uint32_t> endpoints);

 private:
  std::vector<UniqueFd> sockets_;
};

}  // namespace gradlane::sidecar
