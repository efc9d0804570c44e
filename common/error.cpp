// The one out-of-line part of gradlane/error.hpp: each error code's name.
#include "gradlane/error.hpp"

namespace gradlane {

std::string_view errc_name(Errc code) noexcept {
  switch (code) {
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::out_of_range:
      return "out_of_range";
    case Errc::device_not_found:
      return "device_not_found";
    case Errc::no_usable_gid:
      return "no_usable_gid";
    case Errc::port_not_active:
      return "port_not_active";
    case Errc::memlock_too_low:
      return "memlock_too_low";
    case Errc::registration_failed:
      return "registration_failed";
    case Errc::address_unresolved:
      return "address_unresolved";
    case Errc::route_unresolved:
      return "route_unresolved";
    case Errc::connection_rejected:
      return "connection_rejected";
    case Errc::unreachable:
      return "unreachable";
    case Errc::timeout:
      return "timeout";
    case Errc::peer_gone:
      return "peer_gone";
    case Errc::remote_access:
      return "remote_access";
    case Errc::operation_failed:
      return "operation_failed";
    case Errc::protocol:
      return "protocol";
    case Errc::resource_exhausted:
      return "resource_exhausted";
    case Errc::sidecar_unavailable:
      return "sidecar_unavailable";
    case Errc::unsupported:
      return "unsupported";
    case Errc::system:
      return "system";
  }
  return "unknown";
}

}  // namespace gradlane
