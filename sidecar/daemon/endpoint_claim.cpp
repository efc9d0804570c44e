#include "sidecar/daemon/endpoint_claim.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "common/syscall_error.hpp"
#include "gradlane/error.hpp"

namespace gradlane::sidecar {
namespace {

// The abstract address "\0gradlaned/endpoint/<id>" and its length.
std::pair<sockaddr_un, socklen_t> claim_address(std::uint32_t endpoint) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = fmt::format("gradlaned/endpoint/{}", endpoint);
  const std::size_t length = std::min(name.size(), sizeof address.sun_path - 1);
  std::memcpy(address.sun_path + 1, name.data(), length);  // sun_path[0] == 0: abstract
  return {address, static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length)};
}

UniqueFd unix_socket() {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) detail::throw_call_failed(Errc::system, "socket(AF_UNIX)", errno);
  return fd;
}

// Who listens on the claim ("gradlaned pid 12, uid 0"), or "another process" if it cannot be
// told. Non-blocking: the holder never accepts, so once its backlog is full of earlier probes a
// blocking connect would wait for good.
std::string holder(const sockaddr_un& address, socklen_t length) {
  const UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  ucred credentials{};
  socklen_t size = sizeof credentials;
  if (!probe || ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      ::getsockopt(probe.get(), SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0 || credentials.pid <= 0) {
    return "another process";
  }
  // Anyone may bind an abstract name: the uid tells a gradlaned of ours from a squatter.
  return fmt::format("pid {} (uid {})", credentials.pid, credentials.uid);
}

}  // namespace

EndpointClaims EndpointClaims::acquire(std::span<const std::uint32_t> endpoints) {
  EndpointClaims claims;
  // An endpoint named twice is claimed once (--endpoint 1 --endpoint 1 names one NIC).
  for (const std::uint32_t endpoint : std::set<std::uint32_t>(endpoints.begin(), endpoints.end())) {
    UniqueFd fd = unix_socket();
    const auto [address, length] = claim_address(endpoint);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
      const int error = errno;
      if (error != EADDRINUSE)
        detail::throw_call_failed(Errc::system, fmt::format("claiming endpoint {}", endpoint), error);
      throw Error(Errc::invalid_argument,
                  fmt::format("endpoint {} is already claimed on this host, by {}: two sidecars would both hand out "
                              "its sequence numbers. Stop that gradlaned first, or give this one other --endpoint ids",
                              endpoint, holder(address, length)));
    }
    // Listening, so a second claimant can connect and read our pid from the credentials.
    if (::listen(fd.get(), 4) != 0) detail::throw_call_failed(Errc::system, "listen(endpoint claim)", errno);
    claims.sockets_.push_back(std::move(fd));
  }
  return claims;
}

}  // namespace gradlane::sidecar
