// Aggregation over real rxe (`ci/softroce.sh --hosts 3`): a shard server on host 0, its replica
// on host 1, an aggregator on host 2, four workers (1, 2 on host 2; 3, 4 on host 1) pushing to
// the aggregator, each role a separate ps_node process. Checked after each run, byte for byte:
//   - every sum the aggregator wrote is the sum of its members' gradients, recomputed here with
//     scalar float additions in the order the aggregator logged (by worker id, then step);
//   - the server applied exactly the aggregator's forwards, one sequence each, each with its
//     oldest member's computed_on;
//   - server and replica hold bitwise the same model, and it is the initial model with those
//     sums applied in the server's order;
//   - every worker's every step was summed exactly once (a dead worker's hole: left out);
//   - zero-copy, counted: no worker and not the aggregator copied a byte of the full cycle;
//   - every member a worker was told delivered is in the forward the server applied as that
//     sequence; an aggregator killed while it holds members: those are reported not delivered,
//     never acknowledged, and every acknowledged push is applied.
#include <sys/wait.h>

#include <atomic>
#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradlane/gradlane.hpp"

#include "../common/external_process.hpp"
#include "../common/hosts.hpp"
#include "tests/ps/ps_synthetic.hpp"
#include "ps_run.hpp"
#include "ps/receiving/kernels.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

struct AggregationSpec {
  std::size_t floats = 4096;
  std::uint64_t updates = 15;                        // per worker
  std::uint32_t group = 3;                           // not a divisor of the worker count: groups mix workers and steps
  std::map<std::uint32_t, std::uint64_t> die_after;  // worker -> step at which it dies after its request
  // Long, so a group is forwarded short only when no worker is left: group counts are exact.
  std::string linger_ms = "60000";
  std::uint64_t aggregator_dies_after_forwards = 0;  // 0: it lives
  bool restart_aggregator = false;                   // once it died: a new one on its port (aggregator2.*)
  std::uint64_t pace_ms = 0;                         // workers' "compute" before each step
};

class AggregatedRun : public ::testing::Test {
 protected:
  static constexpr std::uint32_t kWorkers = 4;
  static constexpr std::uint32_t kAggregatorId = 9;

  void run(const AggregationSpec& spec) {
    spec_ = spec;
    const auto hosts = hosts_from_env();
    ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
    out_ = fresh_test_dir();
    const std::string node = GRADLANE_PS_NODE, floats = "floats=" + std::to_string(spec.floats),
                      updates = "updates=" + std::to_string(spec.updates), out = "out=" + out_;
    const std::string server_at = "server=" + hosts[0].address + ":7840",
                      replica_at = "replica=" + hosts[1].address + ":7841";
    // The server and the replica serve the workers' pulls and the aggregator's pushes.
    const std::string shard_peers = "workers=" + std::to_string(kWorkers + 1);
    ExternalProcess replica(
        {node, "role=replica", "device=" + hosts[1].device, "port=7841", floats, "slots=8", shard_peers, updates, out},
        out_ + "/replica");
    ExternalProcess server({node, "role=server", "device=" + hosts[0].device, "port=7840", replica_at, floats,
                            "slots=8", shard_peers, updates, out},
                           out_ + "/server");
    ExternalProcess aggregator(
        {node, "role=aggregator", "device=" + hosts[2].device, "port=7842", "id=" + std::to_string(kAggregatorId),
         server_at, replica_at, floats, "group=" + std::to_string(spec.group), "workers=" + std::to_string(kWorkers),
         "linger_ms=" + spec.linger_ms, out,
         "die_after_forwards=" +
             std::to_string(spec.aggregator_dies_after_forwards == 0 ? ~0ull : spec.aggregator_dies_after_forwards)},
        out_ + "/aggregator");
    std::vector<std::unique_ptr<ExternalProcess>> workers;
    for (std::uint32_t id = 1; id <= kWorkers; ++id) {
      const Host& host = id <= 2 ? hosts[2] : hosts[1];
      std::vector<std::string> a = {node,
                                    "role=worker",
                                    "device=" + host.device,
                                    "id=" + std::to_string(id),
                                    server_at,
                                    replica_at,
                                    "aggregator=" + hosts[2].address + ":7842",
                                    floats,
                                    updates,
                                    "gradient=pattern",
                                    out};
      if (spec.die_after.contains(id)) a.push_back("die_after=" + std::to_string(spec.die_after.at(id)));
      if (spec.pace_ms != 0) a.push_back("pace_ms=" + std::to_string(spec.pace_ms));
      workers.push_back(std::make_unique<ExternalProcess>(a, out_ + "/worker" + std::to_string(id)));
    }
    std::optional<ExternalProcess> restarted;
    if (spec.restart_aggregator) {
      const auto died = aggregator.wait_exit(120s);
      ASSERT_TRUE(died && WIFSIGNALED(*died) && WTERMSIG(*died) == SIGKILL) << "the aggregator did not die as told";
      restarted.emplace(
          std::vector<std::string>{node, "role=aggregator", "device=" + hosts[2].device, "port=7842",
                                   "id=" + std::to_string(kAggregatorId), server_at, replica_at, floats,
                                   "group=" + std::to_string(spec.group), "workers=" + std::to_string(kWorkers),
                                   "linger_ms=" + spec.linger_ms, out, "rejoin=1", "name=aggregator2"},
          out_ + "/aggregator2");
    }
    std::map<std::uint32_t, int> exits;
    for (const auto& [id, step] : spec.die_after) exits[id] = 9;  // ps_node's exit when it dies as told
    expect_workers_exit(workers, exits);
    if (::testing::Test::HasFatalFailure()) return;
    if (restarted) {
      const auto status = restarted->wait_exit(120s);
      ASSERT_TRUE(status.has_value()) << "the restarted aggregator did not finish";
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "restarted aggregator status " << *status;
    }
    const bool dies = spec.aggregator_dies_after_forwards != 0;
    std::vector<ExternalProcess*> shard_roles = {&server, &replica};
    if (!restarted) shard_roles.insert(shard_roles.begin(), &aggregator);  // else waited for above
    for (auto* p : shard_roles) {
      const auto status = p->wait_exit(120s);
      ASSERT_TRUE(status.has_value()) << "a shard role did not finish";
      if (dies && p == &aggregator) {
        EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << "aggregator status " << *status;
      } else {
        EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "status " << *status;
      }
    }
    server_model_ = read_model(out_ + "/server.model", spec.floats);
    replica_model_ = read_model(out_ + "/replica.model", spec.floats);
    history_ = read_lines(out_ + "/server.jsonl");
    for (std::uint32_t id = 1; id <= kWorkers; ++id) {
      if (spec.die_after.contains(id)) continue;
      std::ifstream in(out_ + "/worker" + std::to_string(id) + ".json");
      workers_[id] = json::parse(in);
      EXPECT_EQ(workers_[id]["unsettled"].get<std::uint64_t>(), 0u) << "worker " << id << " never heard of a member";
    }
    if (dies) return;  // a killed aggregator leaves no forward log
    forwards_ = read_lines(out_ + "/aggregator.jsonl");
    std::ifstream stats(out_ + "/aggregator.stats.json");
    stats_ = json::parse(stats);
    sums_ = read_model(out_ + "/aggregator.sums", forwards_.size() * spec.floats);  // every sum written, in order
  }

  // A forward's sum recomputed from its members' gradients: scalar additions, left to right,
  // in the order the aggregator says it summed them.
  std::vector<float> expected_sum(const json& forward) const {
    std::vector<float> sum(spec_.floats);
    const auto& members = forward["members"];
    for (std::size_t j = 0; j < sum.size(); ++j) {
      float acc = 0.0F;
      for (std::size_t i = 0; i < members.size(); ++i) {
        const float g =
            examples::gradient_value(members[i][0].get<std::uint64_t>(), members[i][1].get<std::uint64_t>(), j, false);
        acc = i == 0 ? g : acc + g;
      }
      sum[j] = acc;
    }
    return sum;
  }

  // Checks every forward and returns the (worker, step) pairs summed.
  std::set<std::pair<std::uint64_t, std::uint64_t>> check_forwards() {
    std::set<std::pair<std::uint64_t, std::uint64_t>> summed;
    std::map<std::uint64_t, const json*> by_tag;
    for (std::size_t f = 0; f < forwards_.size(); ++f) {
      const json& forward = forwards_[f];
      EXPECT_EQ(forward["tag"].get<std::uint64_t>(), f + 1);
      EXPECT_FALSE(forward["lost"].get<bool>());
      by_tag[forward["tag"].get<std::uint64_t>()] = &forward;
      const auto& members = forward["members"];
      EXPECT_GE(members.size(), 1u);
      EXPECT_LE(members.size(), spec_.group);
      std::uint64_t oldest = ~0ull;
      for (std::size_t i = 0; i < members.size(); ++i) {
        const std::pair<std::uint64_t, std::uint64_t> who{members[i][0].get<std::uint64_t>(),
                                                          members[i][1].get<std::uint64_t>()};
        EXPECT_TRUE(summed.insert(who).second) << "worker " << who.first << " step " << who.second << " summed twice";
        if (i > 0) {
          const std::pair<std::uint64_t, std::uint64_t> before{members[i - 1][0].get<std::uint64_t>(),
                                                               members[i - 1][1].get<std::uint64_t>()};
          EXPECT_LT(before, who) << "forward " << f + 1 << " not summed in (worker, step) order";
        }
        oldest = std::min(oldest, members[i][2].get<std::uint64_t>());
      }
      EXPECT_EQ(forward["computed_on"].get<std::uint64_t>(), oldest)
          << "forward " << f + 1 << " understates its staleness";
      const std::vector<float> expected = expected_sum(forward);
      EXPECT_EQ(std::memcmp(sums_.data() + f * spec_.floats, expected.data(), spec_.floats * sizeof(float)), 0)
          << "forward " << f + 1 << ": the aggregator's sum is not its members summed in the logged order";
    }
    // The server applied exactly the forwards, each once, as the aggregator's worker, in
    // sequence order, with the forward's computed_on; the reference applies the same sums.
    EXPECT_EQ(history_.size(), forwards_.size());
    std::vector<float> reference(spec_.floats);
    for (std::size_t j = 0; j < reference.size(); ++j) reference[j] = examples::initial_value(j);
    std::set<std::uint64_t> applied_tags;
    for (std::size_t i = 0; i < history_.size(); ++i) {
      const json& u = history_[i];
      EXPECT_EQ(u["seq"].get<std::uint64_t>(), i + 1);
      EXPECT_FALSE(u["skipped"].get<bool>());
      EXPECT_EQ(u["worker"].get<std::uint64_t>(), kAggregatorId)
          << "the server applied an update not from the aggregator";
      const auto tag = u["tag"].get<std::uint64_t>();
      EXPECT_TRUE(applied_tags.insert(tag).second) << "forward " << tag << " applied twice";
      const auto it = by_tag.find(tag);
      if (it == by_tag.end()) {
        ADD_FAILURE() << "the server applied forward " << tag << ", which the aggregator never sent";
        continue;
      }
      EXPECT_EQ((*it->second)["seq"].get<std::uint64_t>(), u["seq"].get<std::uint64_t>());
      EXPECT_EQ((*it->second)["computed_on"].get<std::uint64_t>(), u["computed_on"].get<std::uint64_t>());
      ps::sgd_step(reference, expected_sum(*it->second), examples::kLearningRate);
    }
    EXPECT_TRUE(std::memcmp(server_model_.data(), reference.data(), spec_.floats * sizeof(float)) == 0)
        << "the server's model is not the forwarded sums applied in its order";
    EXPECT_TRUE(std::memcmp(server_model_.data(), replica_model_.data(), spec_.floats * sizeof(float)) == 0)
        << "server and replica diverged";
    EXPECT_NE(server_model_[0], examples::initial_value(0)) << "nothing was applied";
    return summed;
  }

  // Every member a worker was told delivered is in the forward applied as that sequence, and
  // every member of a forward was told so (workers that finished).
  void check_delivered() {
    std::set<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> summed, told;  // worker, step, sequence
    for (const json& forward : forwards_) {
      for (const auto& m : forward["members"]) {
        const auto worker = m[0].get<std::uint64_t>();
        if (workers_.contains(static_cast<std::uint32_t>(worker))) {
          summed.insert({worker, m[1].get<std::uint64_t>(), forward["seq"].get<std::uint64_t>()});
        }
      }
    }
    for (const auto& [id, report] : workers_) {
      for (const auto& d : report["delivered"]) told.insert({id, d[0].get<std::uint64_t>(), d[1].get<std::uint64_t>()});
      EXPECT_TRUE(report["undelivered"].empty())
          << "worker " << id << ": a member not delivered with a live aggregator";
    }
    EXPECT_EQ(told, summed) << "what the workers were told delivered is not what the aggregator forwarded";
  }

  // After an aggregator was killed: every push has exactly one outcome, every acknowledged one
  // (delivered members, direct pushes) is applied, and the server's model is bitwise those
  // updates applied in its order (each forward: its delivered members summed in order).
  // Returns how many members were reported not delivered.
  std::uint64_t check_outcomes_after_the_kill() {
    std::map<std::uint64_t, const json*> applied;  // the server's sequence -> its history entry
    for (const json& u : history_) {
      if (!u["skipped"].get<bool>()) applied[u["seq"].get<std::uint64_t>()] = &u;
    }
    // sequence -> the members of the sum it is, in the aggregator's sum order (worker, step)
    std::map<std::uint64_t, std::set<std::pair<std::uint64_t, std::uint64_t>>> sums;
    std::uint64_t undelivered = 0;
    for (const auto& [id, report] : workers_) {
      const auto delivered = report["delivered"], direct = report["acked_steps"];
      undelivered += report["undelivered"].size();
      EXPECT_EQ(delivered.size() + report["undelivered"].size() + direct.size() + report["lost"].get<std::uint64_t>() +
                    report["dropped"].get<std::uint64_t>(),
                spec_.updates)
          << "worker " << id << ": a push with no outcome, or two";
      for (const auto& d : delivered) {
        const auto seq = d[1].get<std::uint64_t>();
        const auto it = applied.find(seq);
        if (it == applied.end()) {
          ADD_FAILURE() << "worker " << id << " step " << d[0] << ": delivered as " << seq << ", not applied";
          continue;
        }
        EXPECT_EQ((*it->second)["worker"].get<std::uint64_t>(), kAggregatorId);
        sums[seq].insert({id, d[0].get<std::uint64_t>()});
      }
      for (const auto& p : direct) {
        const auto it = applied.find(p[0].get<std::uint64_t>());
        if (it == applied.end()) {
          ADD_FAILURE() << "worker " << id << " step " << p[1] << ": acknowledged, not applied";
          continue;
        }
        EXPECT_EQ((*it->second)["worker"].get<std::uint64_t>(), id);
        EXPECT_EQ((*it->second)["tag"].get<std::uint64_t>(), p[1].get<std::uint64_t>());
      }
    }
    // The server's model, recomputed: each forward is its delivered members summed in order.
    std::vector<float> reference(spec_.floats);
    for (std::size_t j = 0; j < reference.size(); ++j) reference[j] = examples::initial_value(j);
    for (const auto& [seq, entry] : applied) {
      std::vector<float> update(spec_.floats);
      const auto worker = (*entry)["worker"].get<std::uint64_t>();
      if (worker == kAggregatorId) {
        if (!sums.contains(seq)) {
          ADD_FAILURE() << "the server applied forward " << seq << " no worker was told of";
          continue;
        }
        json forward = {{"members", json::array()}};
        for (const auto& [w, step] : sums.at(seq)) forward["members"].push_back({w, step, 0});
        update = expected_sum(forward);
      } else {
        for (std::size_t j = 0; j < update.size(); ++j) {
          update[j] = examples::gradient_value(worker, (*entry)["tag"].get<std::uint64_t>(), j, false);
        }
      }
      ps::sgd_step(reference, update, examples::kLearningRate);
    }
    EXPECT_TRUE(std::memcmp(server_model_.data(), reference.data(), spec_.floats * sizeof(float)) == 0)
        << "the server's model is not the acknowledged updates applied in its order";
    EXPECT_TRUE(std::memcmp(server_model_.data(), replica_model_.data(), spec_.floats * sizeof(float)) == 0)
        << "server and replica diverged";
    return undelivered;
  }

  // What worker `id` reported copying on its data path (ps::Worker::bytes_copied).
  std::uint64_t worker_bytes_copied(std::uint32_t id) const {
    std::ifstream in(out_ + "/worker" + std::to_string(id) + ".json");
    return json::parse(in)["bytes_copied"].get<std::uint64_t>();
  }

  AggregationSpec spec_;
  std::string out_;
  std::vector<json> history_, forwards_;
  std::map<std::uint32_t, json> workers_;  // worker<id>.json of the workers that finished
  json stats_;
  std::vector<float> server_model_, replica_model_, sums_;
};

TEST_F(AggregatedRun, GroupsAreSummedInAFixedOrderAndAppliedOnceAtServerAndReplica) {
  run({});
  const auto summed = check_forwards();
  check_delivered();
  const std::uint64_t total = kWorkers * spec_.updates;
  EXPECT_EQ(summed.size(), total) << "a worker's update is missing";
  EXPECT_EQ(stats_["summed"].get<std::uint64_t>(), total);
  // Every group full (60 = 20 × 3, no holes, linger longer than the run): one server update
  // per three gradients.
  EXPECT_EQ(history_.size(), total / spec_.group);
  EXPECT_EQ(stats_["short_groups"].get<std::uint64_t>(), 0u);
  // Zero-copy, counted, over the whole cycle (push to the aggregator, sum, forward + mirror,
  // apply, pull): nothing copied by a worker or the aggregator. (Server and replica apply in
  // place from the slot: the kernels take the slot's and the shard's registered memory.)
  for (std::uint32_t id = 1; id <= kWorkers; ++id) EXPECT_EQ(worker_bytes_copied(id), 0u) << "worker " << id;
  EXPECT_EQ(stats_["bytes_copied"].get<std::uint64_t>(), 0u) << "the aggregator copied";
}

TEST_F(AggregatedRun, InlinePayloadsAreCountedAsCopies) {
  // The counter can see a copy: a 16-float shard (64 bytes) is posted inline, so the provider
  // copies every push into its work request — each worker's 4 pushes to the aggregator, and
  // each forward to the server and to the replica.
  AggregationSpec spec;
  spec.floats = 16;
  spec.updates = 4;
  spec.group = 2;
  run(spec);
  check_forwards();
  for (std::uint32_t id = 1; id <= kWorkers; ++id) EXPECT_EQ(worker_bytes_copied(id), 4u * 64u) << "worker " << id;
  ASSERT_EQ(forwards_.size(), 8u);
  EXPECT_EQ(stats_["bytes_copied"].get<std::uint64_t>(), 8u * 2u * 64u);
}

TEST_F(AggregatedRun, AWorkerKilledBetweenGrantAndWriteIsLeftOutOfItsGroup) {
  // Worker 4 asks the aggregator for a member slot at its step 5 and dies before writing: the
  // aggregator loses the connection, leaves the hole out and goes on; everything else is
  // summed once and applied.
  AggregationSpec spec;
  spec.die_after[4] = 5;
  run(spec);
  const auto summed = check_forwards();
  check_delivered();
  EXPECT_EQ(summed.size(), 3 * spec_.updates + 5);
  EXPECT_EQ(stats_["skipped"].get<std::uint64_t>(), 1u) << "the dead worker's granted member must be left out once";
  for (const auto& [worker, step] : summed) EXPECT_FALSE(worker == 4 && step >= 5) << "a dead worker's step was summed";
}

TEST_F(AggregatedRun, AKilledAggregatorsHeldMembersAreReportedNotDeliveredAndEveryAcknowledgedPushIsApplied) {
  // The aggregator forwards 4 groups, stops for a second while the workers write the members
  // it had granted, and is SIGKILLed holding them. Those pushes returned (pending) but were
  // never forwarded: each must be reported not delivered, not acknowledged. The workers go on
  // to the server directly. Every push has exactly one outcome; every acknowledged one —
  // delivered members, direct pushes — is applied at the server, and the server's model is
  // exactly those updates applied in its order (bitwise, and equal at the replica).
  AggregationSpec spec;
  spec.aggregator_dies_after_forwards = 4;
  run(spec);
  if (::testing::Test::HasFatalFailure()) return;
  const std::uint64_t undelivered = check_outcomes_after_the_kill();
  std::set<std::uint64_t> forwards;
  for (const auto& [id, report] : workers_) {
    for (const auto& d : report["delivered"]) forwards.insert(d[1].get<std::uint64_t>());
  }
  EXPECT_EQ(forwards.size(), 4u) << "four forwards were delivered before the kill";
  EXPECT_GE(undelivered, 1u) << "the aggregator died holding no member: the case is not exercised";
}

TEST_F(AggregatedRun, ARestartedAggregatorIsFoundAgainByItsWorkersAndSumsTheirUpdates) {
  // As above, and a new aggregator process is started on the dead one's port. It tells the
  // server where it listens; the server tells the workers (pushing to it directly since the
  // kill), which connect again and push through it: it must admit all four and forward more
  // groups, and every outcome check above holds across the two lives.
  AggregationSpec spec;
  spec.updates = 30;
  spec.pace_ms = 100;
  spec.linger_ms = "500";
  spec.aggregator_dies_after_forwards = 4;
  spec.restart_aggregator = true;
  run(spec);
  if (::testing::Test::HasFatalFailure()) return;
  check_outcomes_after_the_kill();
  std::ifstream in(out_ + "/aggregator2.stats.json");
  const json second = json::parse(in);
  EXPECT_EQ(second["peers_joined"].get<std::uint64_t>(), kWorkers) << "not every worker came back";
  EXPECT_GT(second["forwarded"].get<std::uint64_t>(), 4u) << "the restarted aggregator summed too little";
  std::uint64_t delivered_after = 0;  // members delivered as sequences after the restart's first forward
  for (const json& forward : read_lines(out_ + "/aggregator2.jsonl")) {
    EXPECT_FALSE(forward["lost"].get<bool>());
    delivered_after += forward["members"].size();
  }
  EXPECT_EQ(delivered_after, second["summed"].get<std::uint64_t>());
  EXPECT_GT(delivered_after, kWorkers * 5u) << "the workers pushed little through the restarted aggregator";
}

}  // namespace
}  // namespace gradlane::testing
