// ShardRun: the fixture of the parameter-server runs over rxe (`ci/softroce.sh --hosts 3`) — a
// shard server on host 0, its replica on host 1, workers on hosts 1 and 2, each a ps_node process —
// and the checks every run ends with.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradlane/gradlane.hpp"

#include "../common/external_process.hpp"
#include "../common/hosts.hpp"
#include "tests/ps/ps_synthetic.hpp"
#include "link_faults.hpp"
#include "ps_run.hpp"
#include "ps/receiving/kernels.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::testing {

using namespace std::chrono_literals;
using json = nlohmann::json;

struct RunSpec {
  std::size_t floats = 4096;
  std::uint64_t updates = 30;  // per worker
  std::string gradient = "pattern";
  std::map<std::uint32_t, std::uint64_t> die_after;  // worker -> step at which it dies after its request
  std::vector<std::string> worker4_args;             // extra ps_node arguments for worker 4
  std::vector<std::string> every_worker_args;        // extra ps_node arguments for every worker
  std::string hole_timeout_ms;                       // empty: ps_node's default
  bool replica_reads = false;                        // workers do not mirror; the replica reads from the server's slots
  // Sidecar mode: gradlaned A on host 0 (endpoints 0 = the server's NIC, 2 = host 2's) owns the
  // server's sequence; gradlaned B serves host 1 (endpoint 1) and reaches A over RDMA.
  bool sidecar = false;
  std::uint64_t server_dies_at = 0;  // the server SIGKILLs itself after applying this many (0: never)
  // The server SIGKILLs itself once this many updates wait behind a sequence not yet written.
  std::uint64_t server_dies_behind_hole = 0;
  bool server_dies() const { return server_dies_at != 0 || server_dies_behind_hole != 0; }
  // Worker 4 is given the replica's address as its server's (and no replica); the server
  // expects the other three.
  bool worker4_addresses_the_replica = false;
  // Once the server has its workers, host 2's link to host 0 is cut both ways (a link flap):
  // workers 1 and 2 fail over to the replica while the server lives on. In direct mode the
  // server steps down and the promoted replica finishes the job; in sidecar mode the server
  // finishes it (workers 1 and 2 give up: worker_exits).
  bool host2_cut_from_server = false;
  std::map<std::uint32_t, int> worker_exits;  // worker -> its expected exit status (default 0)
  // Membership: worker 4 dies at die_after[4] and is started again from the next step once its
  // process is gone; every worker takes pace_ms before each step so the job outlasts that.
  bool restart_worker4 = false;
  std::uint64_t pace_ms = 0;
  // With server_dies_at: once the replica is promoted, a new replica on host 0 joins it
  // (ShardServer::join_server) while the workers go on; it writes replica2.*.
  bool new_replica_joins = false;
  // With new_replica_joins: the promoted replica SIGKILLs itself at this version (0: never),
  // so the joined one is promoted in turn and the workers fail over to it.
  std::uint64_t promoted_dies_at = 0;
  // Sidecar mode: once gradlaned A (the server's) has granted this many slots, it is SIGKILLed
  // and started again half a second later (0: never); the server takes its own sequence over
  // there and goes on. A count, not a time: a loaded host may grant nothing for seconds.
  std::uint64_t restart_sidecar_a_after_grants = 0;
  std::string momentum;                  // server and replicas: SGD with this momentum (empty: plain SGD)
  bool grant_windows = false;            // the server binds a window per grant (sidecar mode: per claim)
  std::uint64_t promoted_stalls_ms = 0;  // the promoted replica makes no progress this long after it took over
};

// Runs replica, server and four workers (1, 2 on host 2; 3, 4 on host 1) to the end.
class ShardRun : public ::testing::Test {
 protected:
  static constexpr std::uint32_t kWorkers = 4;
  static constexpr const char* kShmA = "/gradlane-ps-test-a";
  static constexpr const char* kShmB = "/gradlane-ps-test-b";

  void run(const RunSpec& spec) {
    spec_ = spec;
    const auto hosts = hosts_from_env();
    ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
    out_ = fresh_test_dir();
    const std::string node = GRADLANE_PS_NODE, floats = "floats=" + std::to_string(spec.floats),
                      updates = "updates=" + std::to_string(spec.updates), out = "out=" + out_;
    const std::string replica_at = "replica=" + hosts[1].address + ":7801";
    std::vector<std::string> shard_args = {floats, "slots=8", "workers=" + std::to_string(kWorkers), updates, out};
    if (!spec.hole_timeout_ms.empty()) shard_args.push_back("hole_timeout_ms=" + spec.hole_timeout_ms);
    if (spec.replica_reads) shard_args.push_back("replica_reads=1");
    if (!spec.momentum.empty()) shard_args.push_back("momentum=" + spec.momentum);
    auto args = [&](std::vector<std::string> head) {
      head.insert(head.begin(), node);
      head.insert(head.end(), shard_args.begin(), shard_args.end());
      return head;
    };
    std::optional<ExternalProcess> sidecar_a, sidecar_b;
    const std::vector<std::string> sidecar_a_command = {GRADLANE_GRADLANED, "--foreground",
                                                        "--shm-name",       kShmA,
                                                        "--device",         hosts[0].device,
                                                        "--endpoint",       "0",
                                                        "--endpoint",       "2",
                                                        "--listen-port",    "7600",
                                                        "--expect-peers",   "1",
                                                        "--link-rate-gbps", "0.1",
                                                        "--replica-bound",  "8",
                                                        "--schedule-log",   out_ + "/sidecar-a.jsonl"};
    if (spec.sidecar) {
      const std::string daemon = GRADLANE_GRADLANED;
      sidecar_a.emplace(sidecar_a_command, out_ + "/gradlaned-a");
      sidecar_b.emplace(std::vector<std::string>{daemon,
                                                 "--foreground",
                                                 "--shm-name",
                                                 kShmB,
                                                 "--device",
                                                 hosts[1].device,
                                                 "--endpoint",
                                                 "1",
                                                 "--standby",
                                                 "0:1",
                                                 "--listen-port",
                                                 "7601",
                                                 "--peer",
                                                 hosts[0].address + ":7600",
                                                 "--link-rate-gbps",
                                                 "0.1",
                                                 "--replica-bound",
                                                 "8",
                                                 "--schedule-log",
                                                 out_ + "/sidecar-b.jsonl"},
                        out_ + "/gradlaned-b");
      // The server attaches within 2 s of starting; a loaded machine can take longer than that
      // to link the two gradlaneds, so start it only once both serve.
      for (const char* name : {"/gradlaned-a.err", "/gradlaned-b.err"}) {
        ASSERT_TRUE(wait_for_text(out_ + name, "gradlaned: serving", std::chrono::seconds(120))) << name;
      }
    }
    std::vector<std::string> replica_args = {"role=replica", "device=" + hosts[1].device, "port=7801"};
    if (spec.promoted_dies_at != 0) replica_args.push_back("die_at=" + std::to_string(spec.promoted_dies_at));
    if (spec.promoted_stalls_ms != 0) {
      replica_args.push_back("stall_after_promotion_ms=" + std::to_string(spec.promoted_stalls_ms));
    }
    // Promoted, it takes the server's sequence over at its own host's sidecar (--standby 0:1).
    if (spec.sidecar) replica_args.insert(replica_args.end(), {std::string("sidecar=") + kShmB, "endpoint=0"});
    if (spec.grant_windows) replica_args.push_back("grant_windows=1");
    ExternalProcess replica(args(replica_args), out_ + "/replica");
    std::vector<std::string> server_args = {"role=server", "device=" + hosts[0].device, "port=7800", replica_at};
    if (spec.grant_windows) server_args.push_back("grant_windows=1");
    if (spec.sidecar) server_args.insert(server_args.end(), {std::string("sidecar=") + kShmA, "endpoint=0"});
    if (spec.server_dies_at != 0) server_args.push_back("die_at=" + std::to_string(spec.server_dies_at));
    if (spec.server_dies_behind_hole != 0) {
      server_args.push_back("die_behind_hole=" + std::to_string(spec.server_dies_behind_hole));
    }
    std::vector<std::string> server_command = args(server_args);
    if (spec.worker4_addresses_the_replica) server_command.push_back("workers=" + std::to_string(kWorkers - 1));
    ExternalProcess server(server_command, out_ + "/server");
    std::vector<std::unique_ptr<ExternalProcess>> workers;
    const auto worker_args = [&](std::uint32_t id) {
      const Host& host = id <= 2 ? hosts[2] : hosts[1];
      const bool stray = id == 4 && spec.worker4_addresses_the_replica;
      std::vector<std::string> a = {
          node,
          "role=worker",
          "device=" + host.device,
          "id=" + std::to_string(id),
          stray ? "server=" + hosts[1].address + ":7801" : "server=" + hosts[0].address + ":7800",
          floats,
          updates,
          "gradient=" + spec.gradient,
          out};
      if (!stray) a.push_back(replica_at);
      if (spec.die_after.contains(id)) a.push_back("die_after=" + std::to_string(spec.die_after.at(id)));
      a.insert(a.end(), spec.every_worker_args.begin(), spec.every_worker_args.end());
      if (id == 4) a.insert(a.end(), spec.worker4_args.begin(), spec.worker4_args.end());
      if (spec.replica_reads) a.push_back("replica_reads=1");
      if (spec.sidecar) {  // workers 1, 2 on host 2 (endpoint 2, sidecar A); 3, 4 on host 1 (endpoint 1, B)
        a.insert(a.end(), {std::string("sidecar=") + (id <= 2 ? kShmA : kShmB), id <= 2 ? "endpoint=2" : "endpoint=1",
                           "server_endpoint=0"});
      }
      if (spec.pace_ms != 0) a.push_back("pace_ms=" + std::to_string(spec.pace_ms));
      return a;
    };
    for (std::uint32_t id = 1; id <= kWorkers; ++id) {
      workers.push_back(std::make_unique<ExternalProcess>(worker_args(id), out_ + "/worker" + std::to_string(id)));
    }
    std::optional<CutBetween> cut;  // restored when the run ends
    if (spec.host2_cut_from_server) {
      ASSERT_TRUE(wait_for_text(out_ + "/server.err", "every peer joined", std::chrono::seconds(120)))
          << "the workers did not join the server";
      cut.emplace(2, hosts[0].address);
    }
    std::optional<ExternalProcess> replica2, replica3;
    if (spec.new_replica_joins) {
      ASSERT_TRUE(wait_for_text(out_ + "/replica.err", "promoted to server", std::chrono::seconds(60)))
          << "the replica was not promoted";
      replica2.emplace(args({"role=replica", "device=" + hosts[0].device, "port=7803", "name=replica2",
                             "join=" + hosts[1].address + ":7801"}),
                       out_ + "/replica2");
      ASSERT_TRUE(wait_for_text(out_ + "/replica2.err", "joined the running server", std::chrono::seconds(60)))
          << "the new replica did not join";
    }
    if (spec.new_replica_joins && spec.promoted_dies_at == 0) {
      // A second one, once the first is in: refused (the server has a replica), the job unharmed.
      // Not when the promoted server dies: a join that reaches it after its death waits out its
      // whole join timeout, and nothing checks its refusal there.
      replica3.emplace(args({"role=replica", "device=" + hosts[2].device, "port=7804", "name=replica3",
                             "join=" + hosts[1].address + ":7801"}),
                       out_ + "/replica3");
    }
    if (spec.restart_sidecar_a_after_grants != 0) {
      ASSERT_TRUE(wait_for_lines_with(sidecar_a_command.back(), "\"kind\":\"go\"", spec.restart_sidecar_a_after_grants,
                                      std::chrono::seconds(120)))
          << "gradlaned A granted fewer than " << spec.restart_sidecar_a_after_grants << " slots in 120 s";
      sidecar_a->kill_hard();
      (void)sidecar_a->wait_exit(10s);
      std::this_thread::sleep_for(500ms);
      std::vector<std::string> again = sidecar_a_command;
      again.back() = out_ + "/sidecar-a2.jsonl";  // a schedule log per life
      sidecar_a.emplace(again, out_ + "/gradlaned-a2");
    }
    auto dying = spec.die_after;
    if (spec.restart_worker4) {
      const auto died = workers[3]->wait_exit(120s);
      ASSERT_TRUE(died && WIFEXITED(*died) && WEXITSTATUS(*died) == 9) << "worker 4 did not die as told";
      auto a = worker_args(4);
      std::erase_if(a, [](const std::string& arg) { return arg.starts_with("die_after="); });
      a.push_back("first_step=" + std::to_string(spec.die_after.at(4) + 1));
      workers[3] = std::make_unique<ExternalProcess>(a, out_ + "/worker4-restarted");
      dying.erase(4);
    }
    std::map<std::uint32_t, int> exits;
    for (const auto& [id, step] : dying) exits[id] = 9;  // ps_node's exit when it dies as told
    if (spec.worker4_addresses_the_replica) exits[4] = 1;
    exits.insert(spec.worker_exits.begin(), spec.worker_exits.end());
    expect_workers_exit(workers, exits);
    if (::testing::Test::HasFatalFailure()) return;
    for (auto* p : {&server, &replica}) {
      const auto status = p->wait_exit(120s);
      ASSERT_TRUE(status.has_value()) << (p == &server ? "server" : "replica") << " did not finish";
      const bool killed = p == &server ? spec.server_dies() : spec.promoted_dies_at != 0;
      if (killed) {
        EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << "status " << *status;
      } else if (p == &server && spec.host2_cut_from_server && !spec.sidecar) {
        EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 5)
            << "a server that stepped down exits 5: " << *status;
      } else {
        EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "status " << *status;
      }
    }
    if (replica2) {
      const auto status = replica2->wait_exit(120s);
      ASSERT_TRUE(status.has_value()) << "the joined replica did not finish";
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "joined replica status " << *status;
    }
    if (replica3) {
      const auto status = replica3->wait_exit(120s);
      ASSERT_TRUE(status.has_value()) << "the refused replica did not exit";
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << "a second replica must be refused: " << *status;
    }
    for (auto* daemon : {&sidecar_a, &sidecar_b}) {
      if (!*daemon) continue;
      ::kill((*daemon)->pid(), SIGTERM);
      const auto status = (*daemon)->wait_exit(10s);
      EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "gradlaned did not stop cleanly";
    }
    if (spec.promoted_dies_at != 0) {
      // Its first promoted replica wrote its history when it died; the joined one finished the
      // job from its snapshot: the job's history is the first up to the snapshot, then the second.
      const std::vector<json> first = read_lines(out_ + "/replica.jsonl"),
                              second = read_lines(out_ + "/replica2.jsonl");
      const auto joined_at = read_lines(out_ + "/replica2.stats.json").at(0)["joined_at"].get<std::uint64_t>();
      ASSERT_LE(joined_at, first.size());
      history_.assign(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(joined_at));
      history_.insert(history_.end(), second.begin(), second.end());
      for (std::size_t i = joined_at; i < first.size() && i < history_.size(); ++i) {
        for (const char* field : {"seq", "worker", "tag", "skipped"}) {  // a replica's history has no computed_on
          EXPECT_EQ(first[i][field], history_[i][field]) << "the promoted servers disagree about sequence " << i + 1;
        }
      }
      server_model_ = read_model(out_ + "/replica2.model", spec.floats);
      return;
    }
    replica_model_ = read_model(out_ + "/replica.model", spec.floats);
    if (spec.server_dies() || (spec.host2_cut_from_server && !spec.sidecar)) {  // the promoted replica finished it
      history_ = read_lines(out_ + "/replica.jsonl");
      server_model_ = replica_model_;
    } else {
      history_ = read_lines(out_ + "/server.jsonl");
      server_model_ = read_model(out_ + "/server.model", spec.floats);
      expect_apply_times_in_order(history_);
    }
  }

  // A server's history says when each update rang and was applied (the timeline's source): an
  // applied update rang before its apply began, and applies and skips follow one another in
  // sequence order.
  static void expect_apply_times_in_order(const std::vector<json>& history) {
    std::int64_t previous_end = 0;
    for (const json& u : history) {
      const auto seq = u["seq"].get<std::uint64_t>();
      const auto rang = u["doorbell_ns"].get<std::int64_t>(), end = u["apply_end_ns"].get<std::int64_t>();
      std::int64_t began = end;  // a skip: the moment it was skipped
      if (!u["skipped"].get<bool>()) {
        began = u["apply_start_ns"].get<std::int64_t>();
        EXPECT_GT(rang, 0) << "sequence " << seq << ": applied without a doorbell time";
        EXPECT_LE(rang, began) << "sequence " << seq << ": applied before its doorbell";
      }
      EXPECT_LE(began, end) << "sequence " << seq;
      EXPECT_GE(began, previous_end) << "sequence " << seq << ": began before the one before it ended";
      previous_end = end;
    }
  }

  // The model the server must hold: the initial shard with every applied update, in the
  // server's order, through the same kernel. `steps` (sequence -> step, from the workers'
  // acknowledged pushes) overrides the history's tag: a sidecar-mode server only counts a
  // worker's arrivals, which a lost push puts off by one.
  std::vector<float> reference(const std::map<std::uint64_t, std::uint64_t>& steps = {}) const {
    std::vector<float> model(spec_.floats), gradient(spec_.floats), velocity(spec_.floats, 0.0F);
    for (std::size_t j = 0; j < model.size(); ++j) model[j] = examples::initial_value(j);
    const float momentum = spec_.momentum.empty() ? 0.0F : std::stof(spec_.momentum);
    for (const json& u : history_) {
      if (u["skipped"].get<bool>()) continue;
      const auto worker = u["worker"].get<std::uint64_t>();
      const auto known = steps.find(u["seq"].get<std::uint64_t>());
      const auto step = known != steps.end() ? known->second : u["tag"].get<std::uint64_t>();
      for (std::size_t j = 0; j < gradient.size(); ++j) {
        gradient[j] = examples::gradient_value(worker, step, j, spec_.gradient == "uniform");
      }
      if (momentum > 0.0F) {
        ps::sgd_momentum_step(model, velocity, gradient, examples::kLearningRate, momentum);
      } else {
        ps::sgd_step(model, gradient, examples::kLearningRate);
      }
    }
    return model;
  }

  void a_new_replica_joins_and_follows(const std::string& momentum) {
    // The server dies after 50 updates and the replica is promoted; a new replica joins the
    // promoted server while the workers go on. It starts from the server's snapshot at the
    // version v it reached and follows every decision after v, reading each update from the
    // server's slot: its history must be the server's from v + 1, its model bitwise the
    // server's, and it must have applied updates itself (a joined replica that only copied the
    // end state, or missed or reordered one decision, fails).
    RunSpec spec;
    spec.updates = 40;
    spec.server_dies_at = 50;
    spec.pace_ms = 150;  // the job outlasts the join by seconds
    spec.new_replica_joins = true;
    spec.momentum = momentum;
    run(spec);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the promoted replica's model is not its history applied";
    const json promoted = read_lines(out_ + "/replica.stats.json").at(0);
    const json joined = read_lines(out_ + "/replica2.stats.json").at(0);
    EXPECT_EQ(promoted["replicas_joined"].get<std::uint64_t>(), 1u);
    const auto joined_at = joined["joined_at"].get<std::uint64_t>();
    EXPECT_GE(joined_at, 50u);
    const std::vector<json> followed = read_lines(out_ + "/replica2.jsonl");
    ASSERT_EQ(joined_at + followed.size(), history_.size()) << "the joined replica did not follow to the end";
    for (std::size_t i = 0; i < followed.size(); ++i) {
      const json& theirs = history_[joined_at + i];
      for (const char* field : {"seq", "worker", "tag", "skipped"}) {
        EXPECT_EQ(followed[i][field], theirs[field]) << "sequence " << joined_at + i + 1 << ": " << field;
      }
    }
    EXPECT_GT(joined["applied"].get<std::uint64_t>(), 20u)
        << "the joined replica applied too little to show it follows";
    // The server told every worker where it listens: each connected to it (and mirrors there).
    EXPECT_EQ(joined["peers_joined"].get<std::uint64_t>(), kWorkers);
    EXPECT_TRUE(bitwise_equal(read_model(out_ + "/replica2.model", spec_.floats), server_model_))
        << "the joined replica's model is not the promoted server's";
    // The second replica was refused, with the reason on both sides.
    EXPECT_EQ(promoted["joins_refused"].get<std::uint64_t>(), 1u);
    EXPECT_TRUE(wait_for_text(out_ + "/replica.err", "this server has a replica", std::chrono::seconds(1)));
    EXPECT_TRUE(wait_for_text(out_ + "/replica3.err", "did not take this replica", std::chrono::seconds(1)));
  }

  // After a run whose server killed itself: the version it died at and how long after its death
  // the replica was promoted (a failure if it never was).
  struct Takeover {
    std::uint64_t died_at_version = 0;
    double seconds = 0.0;
  };
  Takeover takeover() const {
    std::ifstream died(out_ + "/server.died");
    std::int64_t died_at_ns = 0;
    Takeover t;
    died >> died_at_ns >> t.died_at_version;
    EXPECT_GE(t.died_at_version, 50u);  // it checks between progress() rounds, each may apply several
    const json stats = read_lines(out_ + "/replica.stats.json").at(0);
    const auto promoted_at_ns = stats["promoted_at_ns"].get<std::int64_t>();
    EXPECT_GT(promoted_at_ns, died_at_ns) << "the replica was never promoted";
    t.seconds = static_cast<double>(promoted_at_ns - died_at_ns) / 1e9;
    return t;
  }

  static bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }

  RunSpec spec_;
  std::string out_;
  std::vector<json> history_;
  std::vector<float> server_model_, replica_model_;
};

}  // namespace gradlane::testing
