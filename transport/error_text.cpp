#include "transport/error_text.hpp"

#include <cstring>
#include <fmt/format.h>

namespace gradlane {

namespace detail {

const char* op_name(ibv_wr_opcode opcode) {
  switch (opcode) {
    case IBV_WR_RDMA_WRITE:
      return "RDMA WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return "RDMA WRITE_WITH_IMM";
    case IBV_WR_RDMA_READ:
      return "RDMA READ";
    case IBV_WR_SEND:
      return "SEND";
    case IBV_WR_BIND_MW:
      return "BIND_MW";
    case IBV_WR_LOCAL_INV:
      return "LOCAL_INV";
    default:
      return "work request";
  }
}

std::string describe_op(const OpRecord& op) {
  if (op.opcode == IBV_WR_SEND) return fmt::format("SEND of {} bytes", op.length);
  if (op.opcode == IBV_WR_BIND_MW) {
    return fmt::format("BIND_MW of a memory window (rkey {:#x}) over {} bytes at {:#x}", op.rkey, op.length,
                       op.remote_addr);
  }
  if (op.opcode == IBV_WR_LOCAL_INV) return fmt::format("LOCAL_INV of memory window rkey {:#x}", op.rkey);
  const char* dir = op.opcode == IBV_WR_RDMA_READ ? "from" : "to";
  return fmt::format("{} of {} bytes {} remote {:#x} (rkey {:#x})", op_name(op.opcode), op.length, dir, op.remote_addr,
                     op.rkey);
}

Errc errc_for_completion(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
      return Errc::remote_access;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return Errc::peer_gone;
    default:
      return Errc::operation_failed;
  }
}

namespace {

const char* completion_hint(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_REM_ACCESS_ERR:
      return "the peer's NIC refused the access: the remote range lies outside the region the peer "
             "registered, the rkey is wrong or its region was deregistered, or the region lacks the "
             "remote access right this operation needs; through a memory window: the access falls outside "
             "the window's slice, the window was invalidated or bound anew, or it is bound to another "
             "connection";
    case IBV_WC_REM_INV_REQ_ERR:
      return "the peer's NIC found the request invalid (e.g. longer than its region or message limit)";
    case IBV_WC_RETRY_EXC_ERR:
      return "no acknowledgement from the peer within the ACK timeout and its retries: the peer "
             "process or host is gone, or the path to it is broken (GRADLANE_ACK_TIMEOUT and "
             "GRADLANE_RETRY_COUNT set how long this takes)";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "the peer had no receive posted for too long: it stopped draining its queue";
    case IBV_WC_WR_FLUSH_ERR:
      return "flushed because the connection had already failed";
    case IBV_WC_LOC_PROT_ERR:
      return "the local buffer is not covered by the memory region given (lkey/range)";
    case IBV_WC_MW_BIND_ERR:
      return "the device refused to bind the memory window (the slice outside its region, the region "
             "without window-bind access, or the window not free)";
    case IBV_WC_LOC_LEN_ERR:
      return "a received message was longer than the receive buffer";
    default:
      return "see ibv_poll_cq(3) for the status";
  }
}

}  // namespace

Error completion_error(ibv_wc_status status, std::uint32_t vendor_err, const std::string& what,
                       const std::string& connection) {
  return Error(errc_for_completion(status),
               fmt::format("{} on {} failed: {} (status {}, vendor error {:#x}): {}", what, connection,
                           ibv_wc_status_str(status), static_cast<int>(status), vendor_err, completion_hint(status)));
}

Error silent_flush_error(const std::string& what, const std::string& connection) {
  return Error(Errc::operation_failed,
               fmt::format("{} on {} was flushed, and nothing on this connection had failed before: the device "
                           "moved the QP to the error state without completing any operation with the reason "
                           "(rdma_rxe in Linux 6.1 does this when a retried RDMA READ's responses arrive out of "
                           "order, after packet loss; its kernel log then shows a WARNING in rxe_completer)",
                           what, connection));
}

Error cm_event_error(rdma_cm_event_type event, int status, CmPhase phase, const std::string& peer) {
  const char* name = rdma_event_str(event);
  switch (event) {
    case RDMA_CM_EVENT_ADDR_ERROR:
      return Error(Errc::address_unresolved,
                   fmt::format("cannot resolve {}: {} ({}) — is it the address of an RDMA (RoCE/IPoIB) "
                               "interface, reachable from this device's address?",
                               peer, status < 0 ? std::strerror(-status) : "address error", name),
                   status < 0 ? -status : 0);
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return Error(Errc::route_unresolved,
                   fmt::format("no route to {}: {} ({}) — check `ip route get` for it from the device's netdev", peer,
                               status < 0 ? std::strerror(-status) : "route error", name),
                   status < 0 ? -status : 0);
    case RDMA_CM_EVENT_REJECTED:
      // IB CM reject reason 8 = invalid service id: no listener on that port.
      if (status == 8) {
        return Error(Errc::connection_rejected,
                     fmt::format("connection to {} rejected: nothing is listening on that port (start the "
                                 "server first, or check the port)",
                                 peer));
      }
      return Error(Errc::connection_rejected,
                   fmt::format("connection to {} rejected by the peer (reason {}): it refused the request, "
                               "e.g. a different gradlane protocol version or no resources",
                               peer, status));
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return Error(Errc::unreachable,
                   fmt::format("{} did not answer the connection request ({}, status {}): the host is down, "
                               "the address is wrong, or UDP port 4791 (RoCE v2) is filtered",
                               peer, name, status));
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      return Error(Errc::peer_gone, fmt::format("peer {} disconnected ({})", peer, name));
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return Error(Errc::peer_gone, fmt::format("RDMA device removed under connection {} ({})", peer, name));
    default:
      break;
  }
  const char* phase_name = phase == CmPhase::resolve_address ? "resolving the address of"
                           : phase == CmPhase::resolve_route ? "resolving the route to"
                           : phase == CmPhase::connect       ? "connecting to"
                           : phase == CmPhase::accept        ? "accepting"
                                                             : "talking to";
  return Error(Errc::operation_failed,
               fmt::format("unexpected rdma_cm event {} (status {}) while {} {}", name, status, phase_name, peer));
}

}  // namespace detail
}  // namespace gradlane
