// Takeovers between sidecars: a receiver's sequence moving to a peer, fenced by epochs, refused
// for another job, held while the server there looks alive.
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

TEST_F(SlotAgreement, ATakeoverMovesTheReceiversSequenceAndTheOldOwnerDropsWhatWaited) {
  // Server 0's replica runs on host B and was promoted at version 50: B owns receiver 0 from
  // now on. What host A was still holding for it comes back as receiver_moved drops, new
  // requests are scheduled at B from 51, and A answers a request that still reaches it with a
  // receiver_moved drop instead of scheduling it.
  a.scheduler().set_rate(sched::EndpointId{0}, sched::Direction::ingress, 1e3);  // 1 MB: 1000 s, past the horizon
  for (std::uint64_t id = 1; id <= 3; ++id) {
    ASSERT_EQ(b.submit(request(id, 1, 1'000'000), now), sched::SubmitStatus::accepted);
  }
  exchange();
  std::size_t granted_before = 0;
  for (const auto& o : b_out) granted_before += std::holds_alternative<sched::Grant>(o) ? 1 : 0;
  ASSERT_LT(granted_before, 3u) << "some requests must still wait at A for this test";
  const std::size_t waiting = 3 - granted_before;
  b_out.clear();

  ASSERT_TRUE(b.take_over(sched::EndpointId{0}, 50, sched::JobId{1}, now));
  exchange();
  std::size_t moved = 0;
  for (const auto& o : b_out) {
    const auto* d = std::get_if<sched::Drop>(&o);
    ASSERT_NE(d, nullptr) << "only drops come back for what waited";
    EXPECT_EQ(d->reason, sched::DropReason::receiver_moved);
    ++moved;
  }
  EXPECT_EQ(moved, waiting);
  EXPECT_EQ(a.scheduler().pending_parts(), 0u);
  for (const auto& o : a_out) EXPECT_FALSE(std::holds_alternative<sched::Cancel>(o));

  // A new request for receiver 0 is B's now: scheduled here, not forwarded.
  b_out.clear();
  const auto forwarded = b.stats().forwarded;
  sched::Request fresh = request(10, 2, 1000);
  fresh.computed_on = 50;
  ASSERT_EQ(b.submit(fresh, now), sched::SubmitStatus::accepted);
  exchange();
  EXPECT_EQ(b.stats().forwarded, forwarded);
  ASSERT_EQ(b_out.size(), 1u);
  const auto* g = std::get_if<sched::Grant>(&b_out[0]);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->seq, 51u) << "the sequence continues after the promoted version";

  // A request for receiver 0 that still reaches A (sent before its sender heard) is dropped.
  const auto answers = a.stats().answers_sent;
  wire.to[0].push_back(encode(SlotRequest{77, 1, 2, 0, 0, 1000, 0, 1.0, 0, 0}));
  a.schedule(now, a_out);
  EXPECT_EQ(a.stats().answers_sent, answers + 1);
  ASSERT_FALSE(wire.to[1].empty());
  const auto answer = std::get<SlotAnswer>(decode(wire.to[1].back()));
  EXPECT_EQ(answer.kind, AnswerKind::drop);
  EXPECT_EQ(answer.request, 77u);
  EXPECT_EQ(answer.drop_cause, DropCause::receiver_moved);
  EXPECT_EQ(a.scheduler().stats().requests, 3u) << "A scheduled nothing for receiver 0 after the takeover";
}

// A takeover from a peer moves a receiver for good, so A takes only one past every epoch it
// knows, of the job its server serves, once that server is gone.
TEST_F(SlotAgreement, ATakeoverIsRefusedForAnotherJobAndForAStaleEpoch) {
  a.check_servers_with([&](sched::EndpointId) { return false; });  // the server died; not swept yet
  a.serve_job(sched::EndpointId{0}, sched::JobId{1});
  const auto offer = [&](std::uint64_t epoch, std::uint32_t job) {
    wire.to[0].push_back(encode(Takeover{0, 50, epoch, job}));
    exchange();
  };
  offer(1, 2);  // another job's replica
  EXPECT_EQ(a.stats().takeovers_refused, 1u);
  EXPECT_TRUE(a.hands_out(sched::EndpointId{0}));
  offer(1, 1);  // the job's own: taken
  EXPECT_EQ(a.stats().takeovers_refused, 1u);
  EXPECT_FALSE(a.hands_out(sched::EndpointId{0})) << "the receiver moved to B";
  offer(1, 1);  // the same again (a replay): nothing moves
  EXPECT_EQ(a.stats().takeovers_refused, 2u);
  offer(2, 1);
  EXPECT_EQ(a.stats().takeovers_refused, 2u) << "the next epoch is taken";
  EXPECT_EQ(a.stats().takeovers_held, 0u);
}

// A killed server's connections close before its exit shows, so its replica's takeover can
// arrive while the server still looks alive: A holds it, and takes it once the server exits.
TEST_F(SlotAgreement, ATakeoverArrivingWhileTheServerLooksAliveIsTakenOnceItExits) {
  bool alive = true;
  a.check_servers_with([&](sched::EndpointId receiver) { return receiver == sched::EndpointId{0} && alive; });
  a.serve_job(sched::EndpointId{0}, sched::JobId{1});
  wire.to[0].push_back(encode(Takeover{0, 50, 1, 1}));
  exchange();
  EXPECT_EQ(a.stats().takeovers_held, 1u);
  EXPECT_EQ(a.stats().takeovers_refused, 0u);
  EXPECT_TRUE(a.hands_out(sched::EndpointId{0})) << "the sequence stays while its server lives";
  now += kTakeoverHold / 2;
  exchange();
  EXPECT_TRUE(a.hands_out(sched::EndpointId{0}));
  alive = false;
  exchange();
  EXPECT_FALSE(a.hands_out(sched::EndpointId{0})) << "taken once the server exited";
  EXPECT_EQ(a.stats().takeovers_refused, 0u);
}

// A server that lives on past the hold keeps its sequence for good: a replica promoted while
// its server lives (a cut link) must not take the sequence when the server exits much later.
TEST_F(SlotAgreement, ATakeoverHeldPastTheHoldWhileTheServerLivesIsRefused) {
  bool alive = true;
  a.check_servers_with([&](sched::EndpointId receiver) { return receiver == sched::EndpointId{0} && alive; });
  a.serve_job(sched::EndpointId{0}, sched::JobId{1});
  wire.to[0].push_back(encode(Takeover{0, 50, 1, 1}));
  exchange();
  now += kTakeoverHold;
  exchange();
  EXPECT_EQ(a.stats().takeovers_refused, 1u);
  alive = false;
  now += kTakeoverHold;
  exchange();
  EXPECT_TRUE(a.hands_out(sched::EndpointId{0})) << "the refused takeover stays refused";
  EXPECT_EQ(a.stats().takeovers_refused, 1u);
  wire.to[0].push_back(encode(Takeover{0, 50, 2, 1}));  // a later one, the server gone: taken
  exchange();
  EXPECT_FALSE(a.hands_out(sched::EndpointId{0}));
}

// A hello carries the epochs its sender knows, so a sidecar that joins later fences past them:
// a takeover it makes goes out one past the highest it heard of.
TEST_F(SlotAgreement, TakeoverEpochsLearnedFromAHelloAreNeverReused) {
  wire.to[1].push_back(encode(Hello{{0}, {TakeoverMark{5, 7, 1}}}));  // A knows endpoint 5 moved at epoch 7
  exchange();
  wire.to[0].clear();
  ASSERT_TRUE(b.take_over(sched::EndpointId{5}, 40, sched::JobId{1}, now));
  ASSERT_FALSE(wire.to[0].empty());
  const auto sent = std::get<Takeover>(decode(wire.to[0].back()));
  EXPECT_EQ(sent.endpoint, 5u);
  EXPECT_EQ(sent.epoch, 8u);
  EXPECT_EQ(sent.job, 1u);
  exchange();
  EXPECT_EQ(a.stats().takeovers_refused, 0u);
  wire.to[0].push_back(encode(Takeover{5, 40, 8, 1}));  // the same takeover delivered twice
  exchange();
  EXPECT_EQ(a.stats().takeovers_refused, 1u);
}

// A request computed on a version the receiver's sequence has not reached (a model pulled,
// before a failover, from a server that got further than the replica that took over) is
// refused as the owner refuses it locally: version_from_future, not a staleness drop, which
// the worker would take for "pull and recompute" instead of a push that did not happen. The
// owner logs the refusal too.
}  // namespace
}  // namespace gradlane::peer
