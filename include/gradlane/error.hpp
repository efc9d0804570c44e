// gradlane — errors.
//
// Every failure the library reports is a gradlane::Error: a category (Errc) a program can
// branch on, plus a message written for the person running the job — what failed, on which
// device/peer/region, and what to do about it. Errors caused by a peer (it died, it sent a
// malformed message, it rejected an access) never abort the process: they surface as an
// Error on the connection that saw them.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace gradlane {

enum class Errc {
  invalid_argument,     // the caller passed something unusable (bad option, bad slice)
  out_of_range,         // a local or remote slice lies outside its registered region
  device_not_found,     // no RDMA device with that name / address
  no_usable_gid,        // the port has no GID the connection could use (no IPv4 RoCE v2 GID)
  port_not_active,      // the port exists but its link is down
  memlock_too_low,      // RLIMIT_MEMLOCK too small to pin the buffers
  registration_failed,  // ibv_reg_mr failed for another reason
  address_unresolved,   // rdma_cm could not resolve the address (no such address / not RDMA)
  route_unresolved,     // rdma_cm found no route to the peer
  connection_rejected,  // the peer answered but refused (nothing listening, version mismatch)
  unreachable,          // the peer did not answer the connection request in time
  timeout,              // a bounded wait ran out
  peer_gone,            // the peer disconnected or its QP stopped answering (retries exhausted)
  remote_access,        // the peer's NIC refused an RDMA access (bad rkey/address/length)
  operation_failed,     // any other completion error
  protocol,             // a malformed or unexpected message from a peer
  resource_exhausted,   // a queue, credit or table is full
  sidecar_unavailable,  // no gradlaned is running or it stopped answering
  unsupported,          // the device lacks a capability (e.g. type-2 memory windows)
  system,               // an OS or verbs call failed (errno in the message)
};

// Short stable name, e.g. "peer_gone" (for logs and JSON).
std::string_view errc_name(Errc code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message, int sys_errno = 0)
      : std::runtime_error(message), code_(code), sys_errno_(sys_errno) {}
  Errc code() const noexcept { return code_; }
  // errno of the failing system/verbs call, 0 when not applicable.
  int sys_errno() const noexcept { return sys_errno_; }

 private:
  Errc code_;
  int sys_errno_;
};

}  // namespace gradlane
