// Slot agreement between sidecars, with two DistributedPolicies joined by an in-memory
// transport (the RDMA transport is exercised in softroce/).
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

// Host A's end of several in-memory links (A is side 0 of each wire). Links added after
// start-up are reported once by take_joined(), as a restarted peer's new link is.
class HubTransport final : public PeerTransport {
 public:
  PeerIndex add(Wire& wire, bool joined) {
    wires_.push_back(&wire);
    reported_.push_back(false);
    const auto index = static_cast<PeerIndex>(wires_.size() - 1);
    if (joined) joined_.push_back(index);
    return index;
  }
  std::size_t peer_count() const override { return wires_.size(); }
  bool send(PeerIndex p, std::span<const std::byte> m) override {
    if (wires_[p]->broken) return false;
    wires_[p]->to[1].emplace_back(m.begin(), m.end());
    return true;
  }
  std::optional<std::pair<PeerIndex, std::vector<std::byte>>> receive() override {
    for (PeerIndex p = 0; p < wires_.size(); ++p) {
      auto& q = wires_[p]->to[0];
      if (wires_[p]->broken || q.empty()) continue;
      auto m = std::move(q.front());
      q.pop_front();
      return std::pair{p, std::move(m)};
    }
    return std::nullopt;
  }
  std::vector<PeerIndex> take_failed() override {
    std::vector<PeerIndex> failed;
    for (PeerIndex p = 0; p < wires_.size(); ++p) {
      if (wires_[p]->broken && !reported_[p]) {
        reported_[p] = true;
        failed.push_back(p);
      }
    }
    return failed;
  }
  std::vector<PeerIndex> take_joined() override { return std::exchange(joined_, {}); }
  std::string describe(PeerIndex p) const override { return "link-" + std::to_string(p); }

 private:
  std::vector<Wire*> wires_;
  std::vector<bool> reported_;
  std::vector<PeerIndex> joined_;
};

sched::SchedulerConfig config() {
  sched::SchedulerConfig c;
  c.replica_bound.reset();
  c.grant_horizon = Nanos{1'000'000'000};
  return c;
}

sched::Request request(std::uint64_t id, std::uint32_t sender, std::uint64_t bytes) {
  return sched::Request{sched::RequestId{id},
                        sched::JobId{1},
                        sched::EndpointId{sender},
                        sched::EndpointId{0},
                        sched::TensorId{static_cast<std::uint32_t>(id)},
                        bytes,
                        0,
                        1.0,
                        0};
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

// What a job declares it has left crosses to the receiver's sidecar, whose arbiter for the
// sending NIC serves the job with less left first (job 2 here; undeclared, job 1 would win).
TEST_F(SlotAgreement, AJobsDeclaredRemainingWorkReachesTheReceiversArbiter) {
  sched::Request long_job = request(1, 1, 1'000'000), short_job = request(2, 1, 1'000'000);
  long_job.job_remaining = 90'000'000;
  short_job.job = sched::JobId{2};
  short_job.job_remaining = 30'000'000;
  ASSERT_EQ(b.submit(long_job, now), sched::SubmitStatus::accepted);
  ASSERT_EQ(b.submit(short_job, now), sched::SubmitStatus::accepted);
  exchange();
  ASSERT_EQ(b_out.size(), 2u);
  std::map<std::uint64_t, std::uint64_t> seq_of;  // request -> sequence
  for (const auto& o : b_out) {
    const auto& g = std::get<sched::Grant>(o);
    seq_of[static_cast<std::uint64_t>(g.request)] = g.seq;
  }
  EXPECT_EQ(seq_of[2], 1u) << "the short job's update goes first";
  EXPECT_EQ(seq_of[1], 2u);
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

TEST_F(SlotAgreement, LostPeerDropsWhatItOwedAsPeerLostAndItsReceiversStayItsOwn) {
  ASSERT_EQ(b.submit(request(1, 1, 1000), now), sched::SubmitStatus::accepted);
  wire.broken = true;
  wire.to[0].clear();  // the request never arrived
  exchange();
  ASSERT_EQ(b_out.size(), 1u);
  const auto* drop = std::get_if<sched::Drop>(&b_out[0]);
  ASSERT_NE(drop, nullptr) << "the application must hear about its request";
  EXPECT_EQ(drop->request, sched::RequestId{1});
  EXPECT_EQ(drop->reason, sched::DropReason::peer_lost) << "a lost peer is not a staleness drop";
  // Never answered, so the peer's split is unknown: the drop covers the whole update.
  EXPECT_EQ(drop->part, 0u);
  EXPECT_EQ(drop->part_count, 1u);
  EXPECT_EQ(drop->offset, 0u);
  EXPECT_EQ(drop->length, 1000u);
  EXPECT_EQ(b.stats().peers_lost, 1u);
  // Host A may be alive and still granting receiver 0's sequence: B must not grant it too.
  EXPECT_EQ(b.submit(request(2, 1, 1000), now), sched::SubmitStatus::receiver_unreachable);
  EXPECT_EQ(b.stats().forwarded, 1u);
  b_out.clear();
  b.schedule(now + Nanos{1'000'000}, b_out);
  EXPECT_TRUE(b_out.empty()) << "nothing was scheduled locally for the lost peer's receiver";
  EXPECT_EQ(b.scheduler().stats().requests, 0u);
}

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
TEST_F(SlotAgreement, ARemoteRequestFromTheFutureIsDroppedSayingSoAndLoggedByTheOwner) {
  std::vector<std::pair<sched::DropReason, std::string>> logged;
  a.on_decision([&](const sched::Outcome& o, sched::Instant, std::string_view origin) {
    if (const auto* d = std::get_if<sched::Drop>(&o)) logged.emplace_back(d->reason, std::string(origin));
  });
  sched::Request ahead = request(1, 1, 1000);
  ahead.computed_on = 50;                                          // receiver 0 has granted nothing yet
  ASSERT_EQ(b.submit(ahead, now), sched::SubmitStatus::accepted);  // B cannot know: it forwards
  exchange();
  std::size_t drops = 0;
  for (const auto& o : b_out) {
    if (const auto* d = std::get_if<sched::Drop>(&o)) {
      EXPECT_EQ(d->request, sched::RequestId{1});
      EXPECT_EQ(d->reason, sched::DropReason::version_from_future);
      ++drops;
    }
  }
  EXPECT_EQ(drops, 1u);
  ASSERT_EQ(logged.size(), 1u) << "the owner did not log its refusal";
  EXPECT_EQ(logged[0].first, sched::DropReason::version_from_future);
  EXPECT_EQ(logged[0].second, "refused");
  EXPECT_EQ(a.scheduler().stats().requests, 0u);
}

TEST_F(SlotAgreement, AReceiverWhoseServerServesAnotherJobDropsARemoteRequestSayingSo) {
  // Receiver 0's server (at A) is an app of job 1. A request of job 2 forwarded from B is
  // refused at A and comes back to B's app as a drop naming the cause; job 1's still goes.
  a.serve_job(sched::EndpointId{0}, sched::JobId{1});
  sched::Request other_job = request(1, 1, 1000);
  other_job.job = sched::JobId{2};
  ASSERT_EQ(b.submit(other_job, now), sched::SubmitStatus::accepted);  // B cannot know: it forwards
  ASSERT_EQ(b.submit(request(2, 2, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  std::size_t drops = 0, grants = 0;
  for (const auto& o : b_out) {
    if (const auto* d = std::get_if<sched::Drop>(&o)) {
      EXPECT_EQ(d->request, sched::RequestId{1});
      EXPECT_EQ(d->reason, sched::DropReason::receiver_of_another_job);
      ++drops;
    } else if (const auto* g = std::get_if<sched::Grant>(&o)) {
      EXPECT_EQ(g->request, sched::RequestId{2});
      EXPECT_EQ(g->seq, 1u) << "the refused request took no sequence number";
      ++grants;
    }
  }
  EXPECT_EQ(drops, 1u);
  EXPECT_EQ(grants, 1u);
  EXPECT_EQ(a.scheduler().stats().requests, 1u);
}

TEST_F(SlotAgreement, AKeyedReceiversGrantsReachTheRemoteSenderWithTheirTokens) {
  // Receiver 0's server (at A) gave A its grant key: A's answers to B carry each sequence's
  // token, and B's grant outcomes (what B's daemon writes into its app's grant) carry it on.
  // Without a key they carry none.
  const sidecar::GrantKey key = sidecar::random_grant_key();
  a.serve_job(sched::EndpointId{0}, sched::JobId{1}, key);
  ASSERT_EQ(b.submit(request(1, 1, 1000), now), sched::SubmitStatus::accepted);
  ASSERT_EQ(b.submit(request(2, 2, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  std::size_t grants = 0;
  for (const auto& o : b_out) {
    if (const auto* g = std::get_if<sched::Grant>(&o)) {
      EXPECT_EQ(g->token, sidecar::grant_token(key, g->seq)) << "sequence " << g->seq;
      ++grants;
    }
  }
  EXPECT_EQ(grants, 2u);
  // Its server app left: the sequence goes on (until its replica takes it over), its tokens too.
  a.serve_job(sched::EndpointId{0}, std::nullopt);
  b_out.clear();
  ASSERT_EQ(b.submit(request(3, 3, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  ASSERT_EQ(b_out.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<sched::Grant>(b_out[0]));
  EXPECT_EQ(std::get<sched::Grant>(b_out[0]).token, sidecar::grant_token(key, std::get<sched::Grant>(b_out[0]).seq));
  // A server app that attaches without a key: no tokens from then on.
  a.serve_job(sched::EndpointId{0}, sched::JobId{1}, std::nullopt);
  b_out.clear();
  ASSERT_EQ(b.submit(request(4, 4, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  ASSERT_EQ(b_out.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<sched::Grant>(b_out[0]));
  EXPECT_EQ(std::get<sched::Grant>(b_out[0]).token, 0u);
}

TEST(SlotAgreementAlone, ASidecarWithoutEndpointsTakesTheAcksOfTheReceiversItSchedules) {
  // gradlaned without --endpoint schedules every receiver; its server's applied() reports must
  // count there too, or the server's window (its slots) never opens past the first `slots`.
  HubTransport none;
  DistributedPolicy alone{config(), {}, none};
  alone.limit_window(sched::EndpointId{0}, 2);
  const Instant now{Nanos{1'000'000}};
  std::vector<sched::Outcome> out;
  for (std::uint64_t id = 1; id <= 3; ++id)
    ASSERT_EQ(alone.submit(request(id, 1, 1000), now), sched::SubmitStatus::accepted);
  alone.schedule(now, out);
  EXPECT_EQ(out.size(), 2u) << "two slots: two grants";
  EXPECT_TRUE(alone.replica_ack(sched::EndpointId{0}, 1)) << "the server's ack of sequence 1";
  EXPECT_FALSE(alone.replica_ack(sched::EndpointId{0}, 9)) << "an ack beyond what was granted";
  out.clear();
  alone.schedule(now, out);
  EXPECT_EQ(out.size(), 1u) << "the ack opened the window to the third";
}

TEST(SlotAgreementRejoin, ARestartedPeerSidecarComesBackOnANewLinkWithItsEndpoints) {
  // Host B's sidecar dies (its link breaks) and starts again: it connects anew, A introduces
  // itself on the new link, B's Hello gives it back endpoint 1, and B's requests are scheduled
  // by A again, the sequence going on. A third sidecar claiming endpoint 1 while B lives is refused.
  Wire first, second, stray;
  HubTransport hub;
  hub.add(first, /*joined=*/false);
  DistributedPolicy a{config(), {0}, hub};
  std::vector<sched::Outcome> a_out, b_out;
  const Instant now{Nanos{1'000'000}};
  const auto exchange = [&](DistributedPolicy& b) {
    for (int i = 0; i < 8; ++i) {
      b.schedule(now, b_out);
      a.schedule(now, a_out);
    }
  };
  {
    MemoryTransport b_side{first, 1};
    DistributedPolicy b{config(), {1}, b_side};
    a.start();
    b.start();
    exchange(b);
    ASSERT_TRUE(a.ready() && b.ready());
    ASSERT_EQ(b.submit(request(1, 1, 1000), now), sched::SubmitStatus::accepted);
    exchange(b);
    ASSERT_EQ(b_out.size(), 1u);
    EXPECT_EQ(std::get<sched::Grant>(b_out[0]).seq, 1u);
  }
  first.broken = true;  // B's process is gone
  a.schedule(now, a_out);
  EXPECT_EQ(a.stats().peers_lost, 1u);
  // With its only peer lost and nothing asked of it, A still wakes to look for the peer
  // coming back (it comes through schedule(): take_joined).
  ASSERT_TRUE(a.next_wakeup().has_value()) << "A would never take B's new link while idle";
  EXPECT_LE(*a.next_wakeup(), now + std::chrono::milliseconds(20));

  MemoryTransport again{second, 1};
  DistributedPolicy b2{config(), {1}, again};
  hub.add(second, /*joined=*/true);
  b2.start();
  b_out.clear();
  exchange(b2);
  ASSERT_TRUE(b2.ready()) << "A did not introduce itself on the new link";
  ASSERT_EQ(b2.submit(request(2, 1, 1000), now), sched::SubmitStatus::accepted);
  exchange(b2);
  ASSERT_EQ(b_out.size(), 1u);
  const auto* g = std::get_if<sched::Grant>(&b_out[0]);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->seq, 2u) << "the receiver's sequence goes on";

  // A stray sidecar that claims endpoint 1 while B lives: its Hello is refused.
  hub.add(stray, /*joined=*/true);
  const auto errors = a.stats().protocol_errors;
  stray.to[0].push_back(encode(Hello{{1}, {}}));
  a.schedule(now, a_out);
  a.schedule(now, a_out);
  EXPECT_EQ(a.stats().protocol_errors, errors + 1);
  b_out.clear();
  ASSERT_EQ(b2.submit(request(3, 1, 1000), now), sched::SubmitStatus::accepted);
  exchange(b2);
  ASSERT_EQ(b_out.size(), 1u) << "B still owns its endpoint and is answered";
}

TEST_F(SlotAgreement, LostPeerDropsOnlyTheUndecidedPartsWithTheirBytes) {
  // 10 MB cut by A's partitioner (4 MiB target) into near-equal parts. A decides them all, but
  // only its first answer reaches B before the link fails.
  sched::SchedulerConfig c = config();
  const sched::Partitioner split(c.partition_bytes, c.partition_align);
  constexpr std::uint64_t kBytes = 10'000'000;
  const auto parts = split.split(kBytes);
  ASSERT_EQ(parts.size(), 3u);
  a.scheduler().set_rate(sched::EndpointId{0}, sched::Direction::ingress, 1e9);
  ASSERT_EQ(b.submit(request(1, 1, kBytes), now), sched::SubmitStatus::accepted);
  b.schedule(now, b_out);  // forwards the request
  a.schedule(now, a_out);  // decides every part and answers
  ASSERT_GE(wire.to[1].size(), 2u) << "A answered more than one part";
  wire.to[1].resize(1);
  b.schedule(now, b_out);  // takes the one answer that arrived
  std::vector<sched::Grant> granted;
  for (const auto& o : b_out) {
    if (const auto* g = std::get_if<sched::Grant>(&o)) granted.push_back(*g);
  }
  ASSERT_FALSE(granted.empty());
  ASSERT_LT(granted.size(), parts.size()) << "the test needs parts still undecided when the peer goes";
  b_out.clear();
  wire.broken = true;
  exchange();
  std::set<std::uint32_t> decided;
  for (const auto& g : granted) decided.insert(g.part);
  std::size_t drops = 0;
  for (const auto& o : b_out) {
    const auto* d = std::get_if<sched::Drop>(&o);
    ASSERT_NE(d, nullptr);
    ++drops;
    EXPECT_EQ(d->reason, sched::DropReason::peer_lost);
    EXPECT_FALSE(decided.contains(d->part)) << "part " << d->part << " was already granted";
    EXPECT_EQ(d->part_count, parts.size());
    EXPECT_EQ(d->offset, parts.at(d->part).offset) << "part " << d->part;
    EXPECT_EQ(d->length, parts.at(d->part).length) << "part " << d->part;
  }
  EXPECT_EQ(drops + granted.size(), parts.size()) << "every part gets exactly one outcome";
}

TEST_F(SlotAgreement, ReceiverNoSidecarServesIsRefused) {
  sched::Request r = request(5, 1, 1000);
  r.receiver = sched::EndpointId{7};  // neither host announced endpoint 7
  EXPECT_EQ(b.submit(r, now), sched::SubmitStatus::unknown_receiver);
  EXPECT_EQ(a.submit(r, now), sched::SubmitStatus::unknown_receiver);
  exchange();
  EXPECT_TRUE(a_out.empty());
  EXPECT_TRUE(b_out.empty());
  EXPECT_EQ(b.stats().forwarded, 0u);
}

TEST(SlotAgreementAlone, ASidecarWithoutEndpointsSchedulesEveryReceiver) {
  // The permissive mode of a gradlaned started without --endpoint (no peers either).
  Wire wire;
  MemoryTransport none(wire, 0);
  wire.broken = true;  // its one "peer" never existed
  DistributedPolicy alone{config(), {}, none};
  std::vector<sched::Outcome> out;
  alone.schedule(Instant{Nanos{1}}, out);
  sched::Request r = request(1, 1, 1000);
  r.receiver = sched::EndpointId{7};
  EXPECT_EQ(alone.submit(r, Instant{Nanos{1}}), sched::SubmitStatus::accepted);
  alone.schedule(Instant{Nanos{1}}, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<sched::Grant>(out[0]));
}

TEST_F(SlotAgreement, TheReceiversLoggedTimelineNeverOverlaps) {
  // The receiver's schedule log: planned slots, each cut at the used_end of its completion
  // line. Transfers end early (their slot's rest is granted again) and one fails when its
  // sender's sidecar is lost (its slot must stay held: its bytes may still be arriving).
  std::vector<nlohmann::json> log;
  a.on_decision([&](const sched::Outcome& o, Instant at, std::string_view origin) {
    log.push_back(nlohmann::json::parse(sidecar::decision_json(o, at, origin)));
  });
  a.on_completion([&](sched::TransferId t, const sched::TransferView& granted, Instant at, Nanos measured,
                      sched::TransferResult result) {
    log.push_back(nlohmann::json::parse(sidecar::completion_json(t, granted, at, measured, result)));
  });
  a.scheduler().set_rate(sched::EndpointId{0}, sched::Direction::ingress, 1e9);  // 1 MB: 1 ms
  const auto grants_in = [](std::vector<sched::Outcome>& out) {
    std::vector<sched::Grant> g;
    for (const auto& o : out) {
      if (const auto* x = std::get_if<sched::Grant>(&o)) g.push_back(*x);
    }
    out.clear();
    return g;
  };
  // Round 1: two remote workers (1, 2) and one on the receiver's host (3).
  ASSERT_EQ(b.submit(request(1, 1, 1'000'000), now), sched::SubmitStatus::accepted);
  ASSERT_EQ(b.submit(request(2, 2, 1'000'000), now), sched::SubmitStatus::accepted);
  ASSERT_EQ(a.submit(request(3, 3, 1'000'000), now), sched::SubmitStatus::accepted);
  exchange();
  auto remote = grants_in(b_out);
  auto local = grants_in(a_out);
  ASSERT_EQ(remote.size() + local.size(), 3u);
  // Everything finishes early, 300 us into the last slot.
  Instant last_start = now;
  for (const auto& g : remote) last_start = std::max(last_start, g.slot.start);
  for (const auto& g : local) last_start = std::max(last_start, g.slot.start);
  now = last_start + Nanos{300'000};
  for (const auto& g : remote) ASSERT_TRUE(b.complete(g.transfer, now, Nanos{300'000}, sched::TransferResult::ok));
  for (const auto& g : local) ASSERT_TRUE(a.complete(g.transfer, now, Nanos{300'000}, sched::TransferResult::ok));
  exchange();
  // Round 2: granted into the time the early finishers gave back; B's sidecar is lost in its slot.
  ASSERT_EQ(b.submit(request(4, 1, 1'000'000), now), sched::SubmitStatus::accepted);
  exchange();
  remote = grants_in(b_out);
  ASSERT_EQ(remote.size(), 1u);
  EXPECT_EQ(remote[0].slot.start, now) << "the rest of the early finisher's slot was not given back";
  now = remote[0].slot.start + Nanos{200'000};
  wire.broken = true;
  ASSERT_EQ(a.submit(request(5, 3, 1'000'000), now), sched::SubmitStatus::accepted);
  exchange();
  local = grants_in(a_out);
  ASSERT_EQ(local.size(), 1u);
  now = local[0].slot.end;
  ASSERT_TRUE(a.complete(local[0].transfer, now, Nanos{1'000'000}, sched::TransferResult::ok));

  std::map<std::uint64_t, std::pair<std::int64_t, std::int64_t>> timeline;  // transfer -> [start, end)
  std::size_t completions = 0;
  for (const auto& line : log) {
    if (line["kind"] == "go" && line["receiver"] == 0) {
      timeline[line["transfer"].get<std::uint64_t>()] = {line["slot_start"], line["slot_end"]};
    }
  }
  for (const auto& line : log) {
    if (line["kind"] != "completion" || line["receiver"] != 0) continue;
    ++completions;
    auto& slot = timeline.at(line["transfer"].get<std::uint64_t>());
    EXPECT_EQ(slot.first, line["slot_start"].get<std::int64_t>());
    slot.second = std::min(slot.second, line["used_end"].get<std::int64_t>());
    if (line["ok"] == false) {
      EXPECT_EQ(line["used_end"], line["slot_end"]) << "a failed transfer used its whole slot";
    }
  }
  ASSERT_EQ(timeline.size(), 5u);
  EXPECT_EQ(completions, 5u) << "every granted transfer has a completion line";
  std::vector<std::pair<std::int64_t, std::int64_t>> slots;
  for (const auto& [transfer, slot] : timeline) slots.push_back(slot);
  std::sort(slots.begin(), slots.end());
  for (std::size_t i = 1; i < slots.size(); ++i) {
    EXPECT_LE(slots[i - 1].second, slots[i].first)
        << "slot [" << slots[i].first << ", " << slots[i].second << ") overlaps the used part of ["
        << slots[i - 1].first << ", " << slots[i - 1].second << ")";
  }
}

TEST(ScheduleLogFile, StartsEmptyOnEveryRun) {
  const std::string path = ::testing::TempDir() + "gradlane-schedule-log-" + std::to_string(::getpid()) + ".jsonl";
  const sched::Outcome cancel = sched::Cancel{sched::TransferId{1}, sched::JobId{1}, sched::EndpointId{0}, 7};
  for (int run = 0; run < 2; ++run) {
    sidecar::ScheduleLog log(path);
    log.decision(cancel, Instant{Nanos{run}}, "here");
  }
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ::unlink(path.c_str());
  ASSERT_EQ(lines.size(), 1u) << "the second run appended to the first run's log";
  EXPECT_EQ(nlohmann::json::parse(lines[0])["at"], 1);
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
