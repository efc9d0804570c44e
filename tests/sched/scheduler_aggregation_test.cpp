// Aggregation: which waiting updates are grouped, which aggregator sums them, and that the
// aggregate takes one slot (one sequence number) at the server.
#include <gtest/gtest.h>

#include "sched_test_util.hpp"
#include "sidecar/core/scheduler.hpp"

namespace gradlane::sched {
namespace {

using namespace testing;

constexpr std::uint32_t kServer = 100;

// 10 GB/s everywhere (1 MB = 100 us), sum time 20 us. Aggregator 200 has a slow 2 GB/s
// ingress, aggregator 201 a full 10 GB/s one.
Scheduler make(std::optional<std::uint32_t> tau = std::nullopt, bool aggregators = true) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  c.staleness_bound = tau;
  Scheduler s(c);
  if (aggregators) {
    s.add_aggregator(JobId{1}, ep(200));
    s.add_aggregator(JobId{1}, ep(201));
    s.set_rate(ep(200), Direction::ingress, 2 * kGBps);
  }
  return s;
}

void submit_workers(Scheduler& s, std::initializer_list<std::uint32_t> workers, TensorId tensor = TensorId{1}) {
  for (const std::uint32_t w : workers) {
    Request r = request(w, w, kServer, kMB);
    r.tensor = tensor;
    ASSERT_EQ(s.submit(r, at_us(0)), SubmitStatus::accepted);
  }
}

TEST(SchedulerAggregation, WaitingUpdatesAreSummedAtTheAggregatorWithSpareBandwidth) {
  Scheduler s = make();
  submit_workers(s, {1, 2, 3, 4});
  const auto out = s.schedule(at_us(0));
  ASSERT_EQ(out.size(), 5u);

  const Grant& g = std::get<Grant>(out[0]);
  EXPECT_EQ(g.request, RequestId{1});
  EXPECT_EQ(g.slot, (Slot{at_us(0), at_us(100)}));
  EXPECT_EQ(g.seq, 1u);

  // 2, 3, 4 would wait behind it: redirected to 201 (200's ingress is too slow to beat the
  // server), back to back on 201's ingress.
  for (std::uint32_t i = 0; i < 3; ++i) {
    const Redirect& r = std::get<Redirect>(out[1 + i]);
    EXPECT_EQ(r.request, RequestId{i + 2});
    EXPECT_EQ(r.aggregator, ep(201));
    EXPECT_EQ(r.receiver, ep(kServer));
    EXPECT_EQ(r.slot, (Slot{at_us(100 * i), at_us(100 * (i + 1))}));
  }

  const AggregateGrant& a = std::get<AggregateGrant>(out[4]);
  EXPECT_EQ(a.aggregator, ep(201));
  EXPECT_EQ(a.receiver, ep(kServer));
  EXPECT_EQ(a.members, (std::vector<PartRef>{{RequestId{2}, 0}, {RequestId{3}, 0}, {RequestId{4}, 0}}));
  EXPECT_EQ(a.slot, (Slot{at_us(320), at_us(420)}));  // summed at 300 + 20
  EXPECT_EQ(a.seq, 2u);                               // one slot, one version for three updates
  EXPECT_EQ(a.delay, 1u);
  EXPECT_EQ(a.length, kMB);

  EXPECT_EQ(s.server_version(ep(kServer)), 2u);
  EXPECT_EQ(s.ingress(ep(kServer))->slots().size(), 2u);
  EXPECT_EQ(s.stats().aggregates, 1u);
  EXPECT_EQ(s.stats().redirects, 3u);
  EXPECT_EQ(s.pending_aggregates(), 0u);
}

// The same four, but 3 and 4 cannot reach an aggregator (Request::direct_only: their worker has
// none, or lost it): only 2 waits to be grouped — alone, no group — so everything goes to the
// server, each in its own slot.
TEST(SchedulerAggregation, AnUpdateThatCannotReachAnAggregatorIsNeverRedirected) {
  Scheduler s = make();
  for (const std::uint32_t w : {1u, 2u, 3u, 4u}) {
    Request r = request(w, w, kServer, kMB);
    r.direct_only = w >= 3;
    ASSERT_EQ(s.submit(r, at_us(0)), SubmitStatus::accepted);
  }
  const auto out = s.schedule(at_us(0));
  EXPECT_EQ(s.stats().redirects, 0u);
  EXPECT_EQ(granted_ids(out), (std::vector<std::uint64_t>{1, 2, 3, 4}));
  // With only 4 direct-only, 2 and 3 still form a group: the flag removes exactly its update.
  Scheduler t = make();
  for (const std::uint32_t w : {1u, 2u, 3u, 4u}) {
    Request r = request(w, w, kServer, kMB);
    r.direct_only = w == 4;
    ASSERT_EQ(t.submit(r, at_us(0)), SubmitStatus::accepted);
  }
  const auto grouped = t.schedule(at_us(0));
  EXPECT_EQ(t.stats().redirects, 2u);
  for (const auto& o : grouped) {
    if (const auto* r = std::get_if<Redirect>(&o)) {
      EXPECT_NE(r->request, RequestId{4});
    }
  }
}

// A server whose ingress is 10x narrower than the workers' links: two updates arrive together.
// By default the first is granted and the second, alone behind it, is no group; with
// pick_joins both go to the aggregator, which collects them in a fraction of one server slot,
// and the server spends one slot on the two.
TEST(SchedulerAggregation, WithPickJoinsTheNextUpdateJoinsThoseBehindIt) {
  for (const bool pick_joins : {false, true}) {
    SchedulerConfig c = plain_config();
    c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
    c.aggregation.pick_joins = pick_joins;
    Scheduler s(c);
    s.add_aggregator(JobId{1}, ep(201));
    s.set_rate(ep(kServer), Direction::ingress, 1 * kGBps);  // 1 MB = 1000 us
    submit_workers(s, {1, 2});
    const auto out = s.schedule(at_us(0));
    if (!pick_joins) {  // each its own server slot
      EXPECT_EQ(granted_ids(out), (std::vector<std::uint64_t>{1, 2}));
      EXPECT_EQ(s.stats().redirects, 0u);
      continue;
    }
    ASSERT_EQ(out.size(), 3u);
    const Redirect& first = std::get<Redirect>(out[0]);
    const Redirect& second = std::get<Redirect>(out[1]);
    EXPECT_EQ(first.request, RequestId{1});
    EXPECT_EQ(second.request, RequestId{2});
    EXPECT_EQ(first.slot, (Slot{at_us(0), at_us(100)}));  // at the workers' 10 GB/s
    EXPECT_EQ(second.slot, (Slot{at_us(100), at_us(200)}));
    const AggregateGrant& a = std::get<AggregateGrant>(out[2]);
    EXPECT_EQ(a.members, (std::vector<PartRef>{{RequestId{1}, 0}, {RequestId{2}, 0}}));
    EXPECT_EQ(a.slot, (Slot{at_us(220), at_us(1220)}));  // summed at 200 + 20, one server slot
    EXPECT_EQ(a.seq, 1u);
    EXPECT_EQ(s.stats().grants, 0u);
  }
}

// A straggler (egress 0.1 GB/s) alone, to a server of 1 GB/s: sent straight, it would hold the
// server's ingress for 10 ms; relayed, the aggregator's ingress takes those 10 ms and the server
// only the 1 ms forward. Without relay_ratio it is granted as usual.
TEST(SchedulerAggregation, ARelayTakesAStragglersUpdateOffTheServersIngress) {
  for (const double relay_ratio : {0.0, 4.0}) {
    SchedulerConfig c = plain_config();
    c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
    c.aggregation.pick_joins = true;
    c.aggregation.relay_ratio = relay_ratio;
    Scheduler s(c);
    s.add_aggregator(JobId{1}, ep(201));
    s.set_rate(ep(kServer), Direction::ingress, 1 * kGBps);
    s.set_rate(ep(9), Direction::egress, 0.1 * kGBps);
    submit_workers(s, {9});
    const auto out = s.schedule(at_us(0));
    if (relay_ratio == 0.0) {
      EXPECT_EQ(granted_ids(out), (std::vector<std::uint64_t>{9}));
      continue;
    }
    ASSERT_EQ(out.size(), 2u);
    const Redirect& r = std::get<Redirect>(out[0]);
    EXPECT_EQ(r.request, RequestId{9});
    EXPECT_EQ(r.aggregator, ep(201));
    EXPECT_EQ(r.slot, (Slot{at_us(0), at_us(10'000)}));
    const AggregateGrant& a = std::get<AggregateGrant>(out[1]);
    EXPECT_EQ(a.members, (std::vector<PartRef>{{RequestId{9}, 0}}));
    EXPECT_EQ(a.slot, (Slot{at_us(10'020), at_us(11'020)}));  // the server holds 1 ms, not 10
  }
  // A ratio the straggler does not reach (10 ms is not 20x the 1 ms forward): granted.
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  c.aggregation.pick_joins = true;
  c.aggregation.relay_ratio = 20.0;
  Scheduler s(c);
  s.add_aggregator(JobId{1}, ep(201));
  s.set_rate(ep(kServer), Direction::ingress, 1 * kGBps);
  s.set_rate(ep(9), Direction::egress, 0.1 * kGBps);
  submit_workers(s, {9});
  EXPECT_EQ(granted_ids(s.schedule(at_us(0))), (std::vector<std::uint64_t>{9}));
}

// A straggler (worker 9, egress 0.2 GB/s) with one 1 MB update for a 1 GB/s server; with an
// aggregator (201) if asked.
Scheduler straggler_before_server(const SchedulerConfig& c, bool with_aggregator) {
  Scheduler s(c);
  if (with_aggregator) s.add_aggregator(JobId{1}, ep(201));
  s.set_rate(ep(kServer), Direction::ingress, 1 * kGBps);
  s.set_rate(ep(9), Direction::egress, 0.2 * kGBps);
  submit_workers(s, {9});
  return s;
}

// Writers that mirror to the replica (writers_mirror) send each direct update twice: a
// straggler of 0.2 GB/s holds a 1 GB/s server 10 ms per 1 MB update, not 5. Its write to an
// aggregator is not mirrored (the aggregator's forward is): relayed, its slot is 5 ms and the
// server's 1 ms. So at relay ratio 8 it is relayed only when the mirror is counted.
TEST(SchedulerAggregation, AMirroringWriterSendsTwiceOnItsSide) {
  for (const bool mirror : {false, true}) {
    SchedulerConfig c = plain_config();
    c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
    c.replica_bound = 64;
    c.writers_mirror = mirror;
    Scheduler direct = straggler_before_server(c, /*with_aggregator=*/false);
    const auto grants = only<Grant>(direct.schedule(at_us(0)));
    ASSERT_EQ(grants.size(), 1u);
    EXPECT_EQ(grants[0].slot, (Slot{at_us(0), at_us(mirror ? 10'000 : 5'000)}));

    c.aggregation.pick_joins = true;
    c.aggregation.relay_ratio = 8.0;
    Scheduler relaying = straggler_before_server(c, /*with_aggregator=*/true);
    const auto out = relaying.schedule(at_us(0));
    if (!mirror) {
      EXPECT_EQ(granted_ids(out), (std::vector<std::uint64_t>{9}));  // 5 ms < 8 x 1 ms
      continue;
    }
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(std::get<Redirect>(out[0]).slot, (Slot{at_us(0), at_us(5'000)}));
    EXPECT_EQ(std::get<AggregateGrant>(out[1]).slot, (Slot{at_us(5'020), at_us(6'020)}));
  }
}

// Without a replica there is nothing to mirror: writers_mirror changes no slot.
TEST(SchedulerAggregation, WithoutAReplicaNothingIsMirrored) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  c.replica_bound = std::nullopt;
  c.writers_mirror = true;
  Scheduler s = straggler_before_server(c, /*with_aggregator=*/false);
  const auto grants = only<Grant>(s.schedule(at_us(0)));
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].slot, (Slot{at_us(0), at_us(5'000)}));
}

TEST(SchedulerAggregation, WithoutAggregatorsEveryUpdateTakesItsOwnSlot) {
  Scheduler s = make(std::nullopt, /*aggregators=*/false);
  submit_workers(s, {1, 2, 3, 4});
  const auto out = s.schedule(at_us(0));
  EXPECT_EQ(granted_ids(out), (std::vector<std::uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(s.server_version(ep(kServer)), 4u);
}

TEST(SchedulerAggregation, OnlyTheSameSliceOfTheSameTensorIsGrouped) {
  Scheduler s = make();
  submit_workers(s, {1, 2, 3});
  submit_workers(s, {4}, TensorId{2});
  const auto out = s.schedule(at_us(0));
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(std::get<Grant>(out[0]).request, RequestId{1});
  EXPECT_EQ(std::get<Redirect>(out[1]).request, RequestId{2});
  EXPECT_EQ(std::get<Redirect>(out[2]).request, RequestId{3});
  // Tensor 2 cannot join; it goes straight, in the gap while the group is being summed.
  const Grant& g4 = std::get<Grant>(out[3]);
  EXPECT_EQ(g4.request, RequestId{4});
  EXPECT_EQ(g4.slot, (Slot{at_us(100), at_us(200)}));
  EXPECT_EQ(g4.seq, 2u);
  const AggregateGrant& a = std::get<AggregateGrant>(out[4]);
  EXPECT_EQ(a.slot, (Slot{at_us(220), at_us(320)}));
  EXPECT_EQ(a.seq, 3u);
}

TEST(SchedulerAggregation, ASingleWaitingUpdateIsNotAGroup) {
  Scheduler s = make();
  submit_workers(s, {1, 2});
  EXPECT_EQ(granted_ids(s.schedule(at_us(0))), (std::vector<std::uint64_t>{1, 2}));
}

TEST(SchedulerAggregation, MinGroupIsRespected) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  c.aggregation.min_group = 3;
  Scheduler s(c);
  s.add_aggregator(JobId{1}, ep(201));
  submit_workers(s, {1, 2, 3});
  EXPECT_EQ(granted_ids(s.schedule(at_us(0))), (std::vector<std::uint64_t>{1, 2, 3}));
}

// A worker whose own update was just sent still has a free ingress: it may aggregate others.
// The server and the group's own members may not.
TEST(SchedulerAggregation, NeitherTheServerNorAMemberAggregates) {
  SchedulerConfig c = plain_config();
  c.bandwidth = testing::bandwidth_config(10 * kGBps, 0.25, 1e6);
  Scheduler s(c);
  s.add_aggregator(JobId{1}, ep(kServer));
  s.add_aggregator(JobId{1}, ep(2));
  submit_workers(s, {1, 2, 3, 4});
  const auto out = s.schedule(at_us(0));
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(std::get<Grant>(out[0]).request, RequestId{1});
  EXPECT_EQ(std::get<Grant>(out[1]).request, RequestId{2});  // 2 was a member: no aggregator
  EXPECT_EQ(std::get<Redirect>(out[2]).aggregator, ep(2));
  EXPECT_EQ(std::get<Redirect>(out[3]).aggregator, ep(2));
  const AggregateGrant& a = std::get<AggregateGrant>(out[4]);
  EXPECT_EQ(a.aggregator, ep(2));
  EXPECT_EQ(a.slot, (Slot{at_us(220), at_us(320)}));
  EXPECT_EQ(a.seq, 3u);
}

// With tau = 1, three updates behind the first would mean two drops; summed, they take one
// version and all make it.
TEST(SchedulerAggregation, AggregationSavesUpdatesFromTheStalenessBound) {
  Scheduler direct = make(1, /*aggregators=*/false);
  submit_workers(direct, {1, 2, 3, 4});
  const auto d = direct.schedule(at_us(0));
  EXPECT_EQ(granted_ids(d), (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(only<Drop>(d).size(), 2u);

  Scheduler summed = make(1);
  submit_workers(summed, {1, 2, 3, 4});
  const auto a = summed.schedule(at_us(0));
  EXPECT_EQ(only<Drop>(a).size(), 0u);
  ASSERT_EQ(only<AggregateGrant>(a).size(), 1u);
  EXPECT_EQ(only<AggregateGrant>(a)[0].delay, 1u);
}

// Once its members are on their way, the aggregate's version is reserved: an update that could
// go earlier but would push the aggregate past tau waits, and is dropped if it then cannot make
// it. A redirected update is never dropped after crossing the network.
TEST(SchedulerAggregation, TheAggregateKeepsItsVersionReserved) {
  Scheduler s = make(1);
  submit_workers(s, {1, 2, 3});
  submit_workers(s, {9}, TensorId{2});
  const auto out = s.schedule(at_us(0));
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(std::get<Grant>(out[0]).request, RequestId{1});
  EXPECT_EQ(std::get<Redirect>(out[1]).request, RequestId{2});
  EXPECT_EQ(std::get<Redirect>(out[2]).request, RequestId{3});
  const AggregateGrant& a = std::get<AggregateGrant>(out[3]);
  EXPECT_EQ(a.seq, 2u);
  EXPECT_EQ(a.delay, 1u);
  const Drop& d = std::get<Drop>(out[4]);
  EXPECT_EQ(d.request, RequestId{9});
  EXPECT_EQ(d.delay, 2u);
}

TEST(SchedulerAggregation, RedirectsAreCountedAgainstTheSendersCredit) {
  Scheduler s = make();
  submit_workers(s, {1, 2, 3});
  const auto out = s.schedule(at_us(0));
  const auto redirects = only<Redirect>(out);
  ASSERT_EQ(redirects.size(), 2u);
  EXPECT_EQ(s.in_flight(ep(2)), kMB);
  EXPECT_TRUE(s.complete(redirects[0].transfer, at_us(100), us(100)));
  EXPECT_EQ(s.in_flight(ep(2)), 0u);
  // The aggregate is the aggregator forwarding others' updates: not its own credit.
  const auto agg = only<AggregateGrant>(out);
  ASSERT_EQ(agg.size(), 1u);
  EXPECT_EQ(s.in_flight(ep(201)), 0u);
  EXPECT_TRUE(s.complete(agg[0].transfer, at_us(320), us(100)));
  EXPECT_FALSE(s.complete(agg[0].transfer, at_us(320), us(100)));
}

}  // namespace
}  // namespace gradlane::sched
