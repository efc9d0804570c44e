// The peer sidecars' wire messages: every kind round-trips, and malformed input is a protocol
// error naming the problem.
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

namespace gradlane::peer {
namespace {

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
  SlotAnswer moved;
  moved.kind = AnswerKind::drop;
  moved.drop_cause = DropCause::receiver_moved;
  EXPECT_EQ(std::get<SlotAnswer>(decode(encode(moved))).drop_cause, DropCause::receiver_moved);
  moved.drop_cause = DropCause::refused;
  EXPECT_EQ(std::get<SlotAnswer>(decode(encode(moved))).drop_cause, DropCause::refused);
  moved.drop_cause = DropCause::receiver_of_another_job;
  EXPECT_EQ(std::get<SlotAnswer>(decode(encode(moved))).drop_cause, DropCause::receiver_of_another_job);
  SlotAnswer stamped = m;
  stamped.token = 0x0123'4567'89ab'cdefULL;
  EXPECT_EQ(std::get<SlotAnswer>(decode(encode(stamped))).token, stamped.token);
  const auto takeover = std::get<Takeover>(decode(encode(Takeover{7, 1234, 3, 9})));
  EXPECT_EQ(takeover.endpoint, 7u);
  EXPECT_EQ(takeover.version, 1234u);
  EXPECT_EQ(takeover.epoch, 3u);
  EXPECT_EQ(takeover.job, 9u);
  EXPECT_THROW(decode(encode(Takeover{7, 1234, 0, 9})), Error) << "epochs start at 1";
  const auto hello = std::get<Hello>(decode(encode(Hello{{1, 2}, {TakeoverMark{4, 5, 6}}})));
  ASSERT_EQ(hello.takeovers.size(), 1u);
  EXPECT_EQ(hello.takeovers[0].endpoint, 4u);
  EXPECT_EQ(hello.takeovers[0].epoch, 5u);
  EXPECT_EQ(hello.takeovers[0].job, 6u);
  Hello crowded{{1}, std::vector<TakeoverMark>(kMaxTakeoverMarks + 1, TakeoverMark{1, 1, 1})};
  EXPECT_THROW(decode(encode(crowded)), Error);
  const SlotRequest r{1, 2, 3, 4, 5, 6, 7, 0.25, 8, 40'000'000};
  const auto rb = std::get<SlotRequest>(decode(encode(r)));
  EXPECT_EQ(rb.gradient_norm, 0.25);
  EXPECT_EQ(rb.bytes, 6u);
  EXPECT_EQ(rb.priority, 8u);
  EXPECT_EQ(rb.job_remaining, 40'000'000u);
  EXPECT_FALSE(rb.direct_only);
  SlotRequest direct = r;
  direct.direct_only = true;
  EXPECT_TRUE(std::get<SlotRequest>(decode(encode(direct))).direct_only);
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
  SlotAnswer token_on_drop;
  token_on_drop.kind = AnswerKind::drop;
  token_on_drop.token = 7;
  expect_bad(encode(token_on_drop), "a grant token on an answer that grants no sequence");
  const auto good = encode(SlotRequest{1, 2, 3, 4, 5, 6, 7, 0.5, 8, 9});
  expect_bad({good.begin(), good.begin() + 10}, "truncated");
  auto wrong_magic = good;
  wrong_magic[0] = std::byte{0};
  expect_bad(wrong_magic, "magic");
  auto trailing = good;
  trailing.push_back(std::byte{0});
  expect_bad(trailing, "trailing");
  expect_bad(encode(SlotRequest{1, 2, 3, 4, 5, 0, 7, 0.5, 8, 9}), "of 0 bytes");
  expect_bad(encode(SlotRequest{1, 2, 3, 3, 5, 10, 7, 0.5, 8, 9}), "sender is its receiver");
  expect_bad(encode(SlotRequest{1, 2, 3, 4, 5, 10, 7, std::nan(""), 8, 9}), "non-finite");
  SlotAnswer negative;
  negative.transfer = 1;
  negative.start_in_ns = -5;
  expect_bad(encode(negative), "negative");
  SlotAnswer far_away;
  far_away.transfer = 1;
  far_away.start_in_ns = std::numeric_limits<std::int64_t>::max();  // now + that overflows
  expect_bad(encode(far_away), "ns away");
  SlotAnswer bad_part;
  bad_part.transfer = 1;
  bad_part.part = 4;
  bad_part.part_count = 4;
  expect_bad(encode(bad_part), "part 4 of 4");
  expect_bad(encode(Hello{}), "0 endpoints");
  SlotAnswer cause_on_go;
  cause_on_go.transfer = 1;
  cause_on_go.drop_cause = DropCause::receiver_moved;
  expect_bad(encode(cause_on_go), "not a drop");
  SlotAnswer unknown_cause;
  unknown_cause.kind = AnswerKind::drop;
  unknown_cause.drop_cause = static_cast<DropCause>(5);
  expect_bad(encode(unknown_cause), "unknown drop cause 5");
  auto unknown_type = encode(TransferDone{1, 2, false});
  unknown_type[6] = std::byte{99};
  expect_bad(unknown_type, "unknown message type 99");
}

}  // namespace
}  // namespace gradlane::peer
