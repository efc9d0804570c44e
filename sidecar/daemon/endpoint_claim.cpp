#include "sidecar/daemon/endpoint_claim.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
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

// The pid of the process listening on the claim, or 0 if it cannot be told.
pid_t holder(const sockaddr_un& address, socklen_t length) {
  const UniqueFd probe = unix_socket();
  if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) return 0;
  ucred credentials{};
  socklen_t size = sizeof credentials;
  if (::getsockopt(probe.get(), SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) return 0;
  return credentials.pid;
}

}  // namespace

EndpointClaims EndpointClaims::acquire(std::span<const std::uint32_t> endpoints) {
  EndpointClaims claims;
  for (const std::uint32_t endpoint : endpoints) {
    UniqueFd fd = unix_socket();
    const auto [address, length] = claim_address(endpoint);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
      const int error = errno;
      if (error != EADDRINUSE) detail::throw_call_failed(Errc::system, fmt::format("claiming endpoint {}", endpoint), error);
      const pid_t pid = holder(address, length);
      throw Error(Errc::invalid_argument,
                  fmt::format("endpoint {} is already served by {} on this host: two sidecars would both hand out "
                              "its sequence numbers. Stop that one first, or give this one other --endpoint ids",
                              endpoint, pid > 0 ? fmt::format("gradlaned pid {}", pid) : std::string("another gradlaned")));
    }
    // Listening, so a second claimant can connect and read our pid from the credentials.
    if (::listen(fd.get(), 4) != 0) detail::throw_call_failed(Errc::system, "listen(endpoint claim)", errno);
    claims.sockets_.push_back(std::move(fd));
  }
  return claims;
}

}  // namespace gradlane::sidecar
