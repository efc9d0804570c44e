// A hostile or broken peer sidecar: garbage, answers that re-split a forwarded request, duplicate
// answers, and more pending requests or bytes than a peer may have.
#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <variant>

#include <gtest/gtest.h>

#include <utility>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "gradlane/sidecar.hpp"
#include "sidecar/peer/distributed_policy.hpp"
#include "sidecar/peer/messages.hpp"
#include "sidecar/peer/schedule_log.hpp"

#include "slot_agreement.hpp"

namespace gradlane::peer {
namespace {

using namespace test_support;

TEST_F(SlotAgreement, HostilePeerMessagesAreDroppedNotFatal) {
  std::vector<std::byte> garbage(40, std::byte{0x5a});
  wire.to[0].push_back(garbage);
  // An answer for a request nobody forwarded, and a completion for a transfer never granted.
  SlotAnswer bogus;
  bogus.request = 777;
  bogus.transfer = 5;
  wire.to[1].push_back(encode(bogus));
  wire.to[0].push_back(encode(TransferDone{12345, 10, false}));
  // A peer claiming an endpoint that is ours.
  wire.to[0].push_back(encode(Hello{{0}, {}}));
  exchange();
  EXPECT_EQ(a.stats().protocol_errors, 3u);
  EXPECT_EQ(b.stats().protocol_errors, 1u);
  EXPECT_TRUE(b_out.empty());
  // Still working afterwards.
  ASSERT_EQ(b.submit(request(1, 1, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  EXPECT_EQ(b_out.size(), 1u);
}

// Answers a peer sends for one of b's forwarded requests, crafted: request 1, 1000 bytes.
SlotAnswer go_answer(std::uint32_t part, std::uint32_t part_count, std::uint64_t offset, std::uint64_t length) {
  SlotAnswer m;
  m.kind = AnswerKind::go;
  m.request = 1;
  m.transfer = 100 + part;
  m.part = part;
  m.part_count = part_count;
  m.offset = offset;
  m.length = length;
  return m;
}

TEST_F(SlotAgreement, AnAnswerThatResplitsAForwardedRequestIsRefusedNotIndexed) {
  ASSERT_EQ(b.submit(request(1, 1, 1000), now), sched::SubmitStatus::accepted);
  wire.to[0].clear();  // a never sees it: the answers below are the hostile peer's own
  wire.to[1].push_back(encode(go_answer(0, 2, 0, 500)));
  // Valid on its own (part < part_count), but the first answer sized the request's parts at 2.
  wire.to[1].push_back(encode(go_answer(100000, 100001, 0, 500)));
  b.schedule(now, b_out);
  EXPECT_EQ(b.stats().protocol_errors, 1u);
  ASSERT_EQ(b_out.size(), 1u) << "the resplit answer must not reach the application";
  // The honest last part still completes the request.
  wire.to[1].push_back(encode(go_answer(1, 2, 500, 500)));
  b.schedule(now, b_out);
  EXPECT_EQ(b.stats().protocol_errors, 1u);
  EXPECT_EQ(b_out.size(), 2u);
}

TEST_F(SlotAgreement, ADuplicateOrOutOfRangeAnswerIsRefused) {
  ASSERT_EQ(b.submit(request(1, 1, 1000), now), sched::SubmitStatus::accepted);
  wire.to[0].clear();
  wire.to[1].push_back(encode(go_answer(0, 3, 0, 400)));
  wire.to[1].push_back(encode(go_answer(0, 3, 0, 400)));     // part 0 again
  wire.to[1].push_back(encode(go_answer(1, 3, 900, 400)));   // past the request's 1000 bytes
  wire.to[1].push_back(encode(go_answer(1, 2000, 0, 400)));  // more parts than bytes, as a first split would be
  b.schedule(now, b_out);
  EXPECT_EQ(b.stats().protocol_errors, 3u);
  EXPECT_EQ(b_out.size(), 1u);
  // The duplicate was not counted: the request still waits for parts 1 and 2.
  wire.to[1].push_back(encode(go_answer(1, 3, 400, 400)));
  wire.to[1].push_back(encode(go_answer(2, 3, 800, 200)));
  wire.to[1].push_back(encode(go_answer(2, 3, 800, 200)));  // after the last: the request is gone
  b.schedule(now, b_out);
  EXPECT_EQ(b_out.size(), 3u);
  EXPECT_EQ(b.stats().protocol_errors, 4u);
}

TEST_F(SlotAgreement, AnAnswerSplittingARequestIntoMorePartsThanAnyPartitionerCutsIsRefused) {
  // 16 MiB: a split into 2^20 parts of 16 bytes fits its bytes, but no partitioner makes it, and
  // accepted it would have b hand the application a drop for each undecided part on a link loss.
  constexpr std::uint64_t kBytes = std::uint64_t{16} << 20;
  ASSERT_EQ(b.submit(request(1, 1, kBytes), now), sched::SubmitStatus::accepted);
  ASSERT_EQ(b.submit(request(2, 1, kBytes), now), sched::SubmitStatus::accepted);
  wire.to[0].clear();
  wire.to[1].push_back(encode(go_answer(0, 1u << 20, 0, 16)));
  SlotAnswer finest = go_answer(0, sched::Partitioner::kMaxParts, 0, kBytes / sched::Partitioner::kMaxParts);
  finest.request = 2;  // the finest split a partitioner makes is taken
  wire.to[1].push_back(encode(finest));
  b.schedule(now, b_out);
  EXPECT_EQ(b.stats().protocol_errors, 1u);
  ASSERT_EQ(b_out.size(), 1u);
  EXPECT_NE(std::get_if<sched::Grant>(&b_out[0]), nullptr);
  wire.broken = true;
  b.schedule(now, b_out);
  std::map<std::uint64_t, std::vector<sched::Drop>> drops;
  for (const sched::Outcome& o : b_out) {
    if (const auto* d = std::get_if<sched::Drop>(&o)) drops[static_cast<std::uint64_t>(d->request)].push_back(*d);
  }
  ASSERT_EQ(drops[1].size(), 1u) << "request 1, never answered, is dropped whole";
  EXPECT_EQ(drops[1][0].length, kBytes);
  EXPECT_EQ(drops[1][0].reason, sched::DropReason::peer_lost);
  EXPECT_EQ(drops[2].size(), sched::Partitioner::kMaxParts - 1) << "request 2's undecided parts";
}

TEST_F(SlotAgreement, APeersRequestsPastItsPendingLimitAreDroppedAndLaterOnesTakenAgain) {
  a.limit_pending_per_peer(2);
  for (std::uint64_t id = 1; id <= 3; ++id)
    ASSERT_EQ(b.submit(request(id, 1, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  EXPECT_EQ(a.stats().remote_refused, 1u);
  EXPECT_EQ(a.stats().remote_requests, 2u);
  const auto dropped = std::count_if(b_out.begin(), b_out.end(), [](const sched::Outcome& o) {
    const auto* d = std::get_if<sched::Drop>(&o);
    return d != nullptr && d->request == sched::RequestId{3} && d->reason == sched::DropReason::peer_refused;
  });
  EXPECT_EQ(dropped, 1) << "the sender's app hears that its request was not taken (refused, not stale)";
  // The first two were decided, so the peer's count is back under the limit.
  ASSERT_EQ(b.submit(request(4, 1, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  EXPECT_EQ(a.stats().remote_requests, 3u);
  EXPECT_EQ(a.stats().remote_refused, 1u);
}

TEST_F(SlotAgreement, APeersRequestsPastItsPendingBytesOrOverTheLargestUpdateAreDropped) {
  // Drops of request `id`, each refused (not stale: the sender's model is fine).
  const auto dropped = [&](std::uint64_t id) {
    return std::count_if(b_out.begin(), b_out.end(), [&](const sched::Outcome& o) {
      const auto* d = std::get_if<sched::Drop>(&o);
      return d != nullptr && d->request == sched::RequestId{id} && d->reason == sched::DropReason::peer_refused;
    });
  };
  a.limit_peer_bytes(kMaxPeerRequestBytes, 2500);
  for (std::uint64_t id = 1; id <= 3; ++id)
    ASSERT_EQ(b.submit(request(id, 1, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  EXPECT_EQ(a.stats().remote_requests, 2u);
  EXPECT_EQ(a.stats().remote_refused, 1u);
  EXPECT_EQ(dropped(3), 1) << "the sender's app hears that its request was not taken";
  // The first two were decided: their bytes no longer count.
  ASSERT_EQ(b.submit(request(4, 1, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  EXPECT_EQ(a.stats().remote_requests, 3u);
  EXPECT_EQ(a.stats().remote_refused, 1u);
  // With room for it, one request larger than any app may ask for (a corrupted or hostile size).
  a.limit_peer_bytes(kMaxPeerRequestBytes, kMaxPendingBytesPerPeer);
  ASSERT_EQ(b.submit(request(5, 1, kMaxPeerRequestBytes + 1), now), sched::SubmitStatus::accepted);
  exchange();
  EXPECT_EQ(a.stats().remote_refused, 2u);
  EXPECT_EQ(dropped(5), 1);
}

}  // namespace
}  // namespace gradlane::peer
