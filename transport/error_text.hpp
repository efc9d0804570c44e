// Internal: turning completion statuses and rdma_cm events into Errors a person can act on.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <string>

#include "gradlane/error.hpp"

namespace gradlane::detail {

// What was posted, kept per send-queue slot so a failed completion can name its operation.
struct OpRecord {
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  std::uint64_t length = 0;
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0;
};

const char* op_name(ibv_wr_opcode opcode);
// "RDMA WRITE of 4096 bytes to remote 0x7f12000000 (rkey 0x1234)"
std::string describe_op(const OpRecord& op);
Errc errc_for_completion(ibv_wc_status status);
Error completion_error(ibv_wc_status status, std::uint32_t vendor_err, const std::string& what,
                       const std::string& connection);
// A flush that is the connection's first failure: the QP entered the error state and no
// operation was completed with the reason (what rdma_rxe in Linux 6.1 does on one path).
Error silent_flush_error(const std::string& what, const std::string& connection);

// The connection-setup phase an unexpected rdma_cm event arrived in.
enum class CmPhase { resolve_address, resolve_route, connect, accept, established };
// An Error for an rdma_cm event that ends connection setup or an established connection.
Error cm_event_error(rdma_cm_event_type event, int status, CmPhase phase, const std::string& peer);

}  // namespace gradlane::detail
