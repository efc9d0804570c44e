// Slot agreement between sidecars: grants, completions, lost peers and the logged timeline, with
// two DistributedPolicies joined by an in-memory transport.
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

// The receiver's sidecar fails what it granted through a lost peer: nobody will report those
// transfers. But their senders live on that host and may be writing still, so the cancels say
// so (a server without grant windows holds such a sequence for the worker that claimed it).
TEST_F(SlotAgreement, ALostPeersGrantsAreCancelledSayingTheirSendersMayStillWrite) {
  ASSERT_EQ(b.submit(request(1, 1, 1000), now), sched::SubmitStatus::accepted);
  exchange();
  ASSERT_EQ(b_out.size(), 1u);
  const auto grant = std::get<sched::Grant>(b_out[0]);
  wire.broken = true;
  a_out.clear();
  exchange();
  std::vector<sched::Cancel> cancels;
  for (const auto& o : a_out) {
    if (const auto* c = std::get_if<sched::Cancel>(&o)) cancels.push_back(*c);
  }
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].seq, grant.seq);
  EXPECT_EQ(cancels[0].receiver, sched::EndpointId{0});
  EXPECT_TRUE(cancels[0].sender_may_write);
}

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

}  // namespace
}  // namespace gradlane::peer
