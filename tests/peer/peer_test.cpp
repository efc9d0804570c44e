// Slot agreement between sidecars, with two DistributedPolicies joined by an in-memory
// transport (the RDMA transport is exercised in softroce/).
#include <algorithm>
#include <cmath>
#include <deque>
#include <variant>

#include <gtest/gtest.h>

#include "sidecar/peer/distributed_policy.hpp"
#include "sidecar/peer/messages.hpp"

namespace gradlane::peer {
namespace {

using sched::Instant;
using sched::Nanos;

// Two ends of an in-memory link; each end sees the other as peer 0.
struct Wire {
  std::deque<std::vector<std::byte>> to[2];
  bool broken = false;
};

class MemoryTransport final : public PeerTransport {
 public:
  MemoryTransport(Wire& wire, int side) : wire_(wire), side_(side) {}
  std::size_t peer_count() const override { return 1; }
  bool send(PeerIndex, std::span<const std::byte> m) override {
    if (wire_.broken) return false;
    wire_.to[1 - side_].emplace_back(m.begin(), m.end());
    return true;
  }
  std::optional<std::pair<PeerIndex, std::vector<std::byte>>> receive() override {
    auto& q = wire_.to[side_];
    if (q.empty()) return std::nullopt;
    auto m = std::move(q.front());
    q.pop_front();
    return std::pair{PeerIndex{0}, std::move(m)};
  }
  std::vector<PeerIndex> take_failed() override {
    if (wire_.broken && !reported_) {
      reported_ = true;
      return {0};
    }
    return {};
  }
  std::string describe(PeerIndex) const override { return side_ == 0 ? "host-b" : "host-a"; }

 private:
  Wire& wire_;
  int side_;
  bool reported_ = false;
};

sched::SchedulerConfig config() {
  sched::SchedulerConfig c;
  c.replica_bound.reset();
  c.grant_horizon = Nanos{1'000'000'000};
  return c;
}

sched::Request request(std::uint64_t id, std::uint32_t sender, std::uint32_t bytes) {
  return sched::Request{sched::RequestId{id}, sched::JobId{1}, sched::EndpointId{sender}, sched::EndpointId{0},
                        sched::TensorId{static_cast<std::uint32_t>(id)}, bytes, 0, 1.0, 0};
}

class SlotAgreement : public ::testing::Test {
 protected:
  Wire wire;
  MemoryTransport a_side{wire, 0}, b_side{wire, 1};
  // Host A hosts the server (endpoint 0); host B hosts two workers (endpoints 1 and 2).
  DistributedPolicy a{config(), {0}, a_side};
  DistributedPolicy b{config(), {1, 2}, b_side};
  std::vector<sched::Outcome> a_out, b_out;
  Instant now{Nanos{1'000'000}};

  void SetUp() override {
    a.start();
    b.start();
    exchange();
    ASSERT_TRUE(a.ready() && b.ready());
  }
  // Lets messages cross until both sides are quiet.
  void exchange() {
    for (int i = 0; i < 8; ++i) {
      b.schedule(now, b_out);
      a.schedule(now, a_out);
    }
  }
};

TEST_F(SlotAgreement, RemoteReceiverGrantsNonOverlappingSlotsInSequence) {
  a.scheduler().set_rate(sched::EndpointId{0}, sched::Direction::ingress, 1e9);
  for (std::uint64_t id = 1; id <= 6; ++id) {
    ASSERT_EQ(b.submit(request(id, id % 2 ? 1 : 2, 1'000'000), now), sched::SubmitStatus::accepted);
  }
  exchange();
  EXPECT_TRUE(a_out.empty()) << "the server host has no applications of its own here";
  ASSERT_EQ(b_out.size(), 6u);
  std::vector<sched::Grant> grants;
  for (const auto& o : b_out) {
    ASSERT_TRUE(std::holds_alternative<sched::Grant>(o));
    grants.push_back(std::get<sched::Grant>(o));
  }
  std::sort(grants.begin(), grants.end(), [](const auto& x, const auto& y) { return x.seq < y.seq; });
  for (std::size_t i = 0; i < grants.size(); ++i) {
    EXPECT_EQ(grants[i].seq, i + 1) << "sequence numbers are the receiver's, dense from 1";
    EXPECT_EQ(grants[i].receiver, sched::EndpointId{0});
    EXPECT_GE(grants[i].slot.start, now);
    if (i > 0) {
      EXPECT_FALSE(grants[i].slot.overlaps(grants[i - 1].slot)) << "slots " << i - 1 << " and " << i;
    }
  }
  EXPECT_EQ(b.stats().forwarded, 6u);
  EXPECT_EQ(a.stats().remote_requests, 6u);
}

TEST_F(SlotAgreement, CompletionTravelsBackAndFreesTheReceiversCredit) {
  ASSERT_EQ(b.submit(request(1, 1, 1'000'000), now), sched::SubmitStatus::accepted);
  exchange();
  ASSERT_EQ(b_out.size(), 1u);
  const auto grant = std::get<sched::Grant>(b_out[0]);
  EXPECT_GT(a.scheduler().in_flight(sched::EndpointId{1}), 0u);
  EXPECT_TRUE(b.complete(grant.transfer, now + Nanos{500'000}, Nanos{400'000}, sched::TransferResult::ok));
  exchange();
  EXPECT_EQ(a.scheduler().in_flight(sched::EndpointId{1}), 0u);
}

TEST_F(SlotAgreement, LocalReceiverStaysLocal) {
  // A request between two endpoints of host B never crosses the wire.
  sched::Request r = request(9, 1, 1000);
  r.receiver = sched::EndpointId{2};
  ASSERT_EQ(b.submit(r, now), sched::SubmitStatus::accepted);
  exchange();
  EXPECT_EQ(b.stats().forwarded, 0u);
  ASSERT_EQ(b_out.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<sched::Grant>(b_out[0]));
}

TEST_F(SlotAgreement, LostPeerDropsWhatItOwedAndReleasesWhatItHeld) {
  ASSERT_EQ(b.submit(request(1, 1, 1000), now), sched::SubmitStatus::accepted);
  wire.broken = true;
  wire.to[0].clear();  // the request never arrived
  exchange();
  ASSERT_EQ(b_out.size(), 1u);
  const auto* drop = std::get_if<sched::Drop>(&b_out[0]);
  ASSERT_NE(drop, nullptr) << "the application must hear about its request";
  EXPECT_EQ(drop->request, sched::RequestId{1});
  EXPECT_EQ(b.stats().peers_lost, 1u);
  // Later requests to that receiver are scheduled locally rather than sent into the void.
  ASSERT_EQ(b.submit(request(2, 1, 1000), now), sched::SubmitStatus::accepted);
  EXPECT_EQ(b.stats().forwarded, 1u);
}

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
  wire.to[0].push_back(encode(Hello{{0}}));
  exchange();
  EXPECT_EQ(a.stats().protocol_errors, 3u);
  EXPECT_EQ(b.stats().protocol_errors, 1u);
  EXPECT_TRUE(b_out.empty());
  // Still working afterwards.
  ASSERT_EQ(b.submit(request(1, 1, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  EXPECT_EQ(b_out.size(), 1u);
}

TEST(PeerMessages, RoundTrip) {
  SlotAnswer m;
  m.kind = AnswerKind::aggregate;
  m.request = 1;
  m.transfer = 2;
  m.part = 3;
  m.part_count = 4;
  m.offset = 5;
  m.length = 6;
  m.seq = 7;
  m.delay = 8;
  m.start_in_ns = 9;
  m.length_ns = 10;
  m.target = 11;
  m.sender = 12;
  m.members = {13, 14};
  const auto back = std::get<SlotAnswer>(decode(encode(m)));
  EXPECT_EQ(back.members, m.members);
  EXPECT_EQ(back.start_in_ns, 9);
  EXPECT_EQ(back.sender, 12u);
  const SlotRequest r{1, 2, 3, 4, 5, 6, 7, 0.25, 8};
  const auto rb = std::get<SlotRequest>(decode(encode(r)));
  EXPECT_EQ(rb.gradient_norm, 0.25);
  EXPECT_EQ(rb.bytes, 6u);
}

TEST(PeerMessages, MalformedInputIsAProtocolErrorNamingTheProblem) {
  auto expect_bad = [](std::vector<std::byte> bytes, const std::string& fragment) {
    try {
      decode(bytes);
      ADD_FAILURE() << "accepted: " << fragment;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::protocol);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  const auto good = encode(SlotRequest{1, 2, 3, 4, 5, 6, 7, 0.5, 8});
  expect_bad({good.begin(), good.begin() + 10}, "truncated");
  auto wrong_magic = good;
  wrong_magic[0] = std::byte{0};
  expect_bad(wrong_magic, "magic");
  auto trailing = good;
  trailing.push_back(std::byte{0});
  expect_bad(trailing, "trailing");
  expect_bad(encode(SlotRequest{1, 2, 3, 4, 5, 0, 7, 0.5, 8}), "of 0 bytes");
  expect_bad(encode(SlotRequest{1, 2, 3, 3, 5, 10, 7, 0.5, 8}), "sender is its receiver");
  expect_bad(encode(SlotRequest{1, 2, 3, 4, 5, 10, 7, std::nan(""), 8}), "non-finite");
  SlotAnswer negative;
  negative.transfer = 1;
  negative.start_in_ns = -5;
  expect_bad(encode(negative), "negative");
  SlotAnswer bad_part;
  bad_part.transfer = 1;
  bad_part.part = 4;
  bad_part.part_count = 4;
  expect_bad(encode(bad_part), "part 4 of 4");
  expect_bad(encode(Hello{}), "0 endpoints");
  auto unknown_type = encode(TransferDone{1, 2, false});
  unknown_type[6] = std::byte{99};
  expect_bad(unknown_type, "unknown message type 99");
}

}  // namespace
}  // namespace gradlane::peer
