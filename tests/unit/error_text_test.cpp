// Error mapping: completion statuses and rdma_cm events become categorised, actionable errors.
#include <set>

#include <gtest/gtest.h>

#include "transport/error_text.hpp"

namespace gradlane::detail {
namespace {

bool contains(const Error& e, std::string_view s) {
  return std::string_view(e.what()).find(s) != std::string_view::npos;
}

TEST(ErrorText, RemoteAccessNamesTheOperationAndTheLikelyCause) {
  const OpRecord op{IBV_WR_RDMA_WRITE, 4096, 0x7f0000002000ull, 0xabc};
  const Error e = completion_error(IBV_WC_REM_ACCESS_ERR, 0x88, describe_op(op), "rxe0 a -> b");
  EXPECT_EQ(e.code(), Errc::remote_access);
  EXPECT_TRUE(contains(e, "RDMA WRITE of 4096 bytes to remote 0x7f0000002000 (rkey 0xabc)")) << e.what();
  EXPECT_TRUE(contains(e, "rxe0 a -> b"));
  EXPECT_TRUE(contains(e, "outside the region")) << e.what();
  EXPECT_TRUE(contains(e, "0x88"));
}

TEST(ErrorText, RetryExhaustedIsPeerGoneAndNamesTheKnobs) {
  const Error e = completion_error(IBV_WC_RETRY_EXC_ERR, 0, "RDMA READ", "c");
  EXPECT_EQ(e.code(), Errc::peer_gone);
  EXPECT_TRUE(contains(e, "GRADLANE_ACK_TIMEOUT"));
}

TEST(ErrorText, AFlushWithNoEarlierFailureSaysNoOperationGaveTheReason) {
  const OpRecord op{IBV_WR_RDMA_READ, 64, 0x7f0000003000ull, 0x281c};
  const Error e = silent_flush_error(describe_op(op), "rxe2 a -> b");
  EXPECT_EQ(e.code(), Errc::operation_failed);
  EXPECT_TRUE(contains(e, "RDMA READ of 64 bytes from remote 0x7f0000003000")) << e.what();
  EXPECT_TRUE(contains(e, "nothing on this connection had failed before")) << e.what();
  EXPECT_TRUE(contains(e, "rxe_completer")) << e.what();
}

TEST(ErrorText, StatusCategories) {
  EXPECT_EQ(errc_for_completion(IBV_WC_RNR_RETRY_EXC_ERR), Errc::peer_gone);
  EXPECT_EQ(errc_for_completion(IBV_WC_REM_INV_REQ_ERR), Errc::remote_access);
  EXPECT_EQ(errc_for_completion(IBV_WC_WR_FLUSH_ERR), Errc::operation_failed);
  EXPECT_EQ(errc_for_completion(IBV_WC_LOC_PROT_ERR), Errc::operation_failed);
}

TEST(ErrorText, OperationNames) {
  EXPECT_EQ(describe_op({IBV_WR_RDMA_READ, 8, 0x10, 0x2}), "RDMA READ of 8 bytes from remote 0x10 (rkey 0x2)");
  EXPECT_EQ(describe_op({IBV_WR_SEND, 100, 0, 0}), "SEND of 100 bytes");
  EXPECT_STREQ(op_name(IBV_WR_RDMA_WRITE_WITH_IMM), "RDMA WRITE_WITH_IMM");
}

TEST(ErrorText, RejectWithInvalidServiceIdMeansNoListener) {
  const Error e = cm_event_error(RDMA_CM_EVENT_REJECTED, 8, CmPhase::connect, "198.18.0.1:9");
  EXPECT_EQ(e.code(), Errc::connection_rejected);
  EXPECT_TRUE(contains(e, "nothing is listening")) << e.what();
  const Error other = cm_event_error(RDMA_CM_EVENT_REJECTED, 28, CmPhase::connect, "p");
  EXPECT_TRUE(contains(other, "refused")) << other.what();
}

TEST(ErrorText, AddressAndRouteErrorsCarryErrno) {
  const Error a = cm_event_error(RDMA_CM_EVENT_ADDR_ERROR, -ETIMEDOUT, CmPhase::resolve_address, "10.9.9.9:1");
  EXPECT_EQ(a.code(), Errc::address_unresolved);
  EXPECT_EQ(a.sys_errno(), ETIMEDOUT);
  EXPECT_TRUE(contains(a, "10.9.9.9:1"));
  const Error r = cm_event_error(RDMA_CM_EVENT_ROUTE_ERROR, -ENETUNREACH, CmPhase::resolve_route, "p");
  EXPECT_EQ(r.code(), Errc::route_unresolved);
  EXPECT_TRUE(contains(r, "ip route get"));
}

TEST(ErrorText, UnreachableAndDisconnect) {
  EXPECT_EQ(cm_event_error(RDMA_CM_EVENT_UNREACHABLE, -110, CmPhase::connect, "p").code(), Errc::unreachable);
  EXPECT_EQ(cm_event_error(RDMA_CM_EVENT_DISCONNECTED, 0, CmPhase::established, "p").code(), Errc::peer_gone);
  EXPECT_EQ(cm_event_error(RDMA_CM_EVENT_DEVICE_REMOVAL, 0, CmPhase::established, "p").code(), Errc::peer_gone);
  const Error odd = cm_event_error(RDMA_CM_EVENT_MULTICAST_JOIN, 0, CmPhase::accept, "p");
  EXPECT_EQ(odd.code(), Errc::operation_failed);
  EXPECT_TRUE(contains(odd, "accepting"));
}

TEST(ErrorText, EveryErrcHasADistinctName) {
  std::set<std::string_view> names;
  for (int c = 0; c <= static_cast<int>(Errc::system); ++c) names.insert(errc_name(static_cast<Errc>(c)));
  EXPECT_EQ(names.size(), static_cast<std::size_t>(Errc::system) + 1);
  EXPECT_EQ(errc_name(Errc::peer_gone), "peer_gone");
}

}  // namespace
}  // namespace gradlane::detail
