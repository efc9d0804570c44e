// The parameter-server data plane over real rxe (`ci/softroce.sh --hosts 3`): a shard server on
// host 0, its replica on host 1, workers on hosts 1 and 2, each a separate ps_node process.
// Checked after each run, byte for byte:
//   - server and replica hold bitwise the same model at the same version;
//   - that model is what applying the workers' gradients in the server's order gives,
//     recomputed here with the same kernel;
//   - every sequence number was decided once, in order; every (worker, step) applied once.
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
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

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
  // workers 1 and 2 fail over to the replica while the server lives on.
  bool host2_cut_from_server = false;
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
      // A second one, once the first is in: refused (the server has a replica), the job unharmed.
      ASSERT_TRUE(wait_for_text(out_ + "/replica2.err", "joined the running server", std::chrono::seconds(60)))
          << "the new replica did not join";
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
    expect_workers_exit(workers, exits);
    if (::testing::Test::HasFatalFailure()) return;
    for (auto* p : {&server, &replica}) {
      const auto status = p->wait_exit(120s);
      ASSERT_TRUE(status.has_value()) << (p == &server ? "server" : "replica") << " did not finish";
      const bool killed = p == &server ? spec.server_dies() : spec.promoted_dies_at != 0;
      if (killed) {
        EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << "status " << *status;
      } else if (p == &server && spec.host2_cut_from_server) {
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
    if (spec.server_dies() || spec.host2_cut_from_server) {  // the promoted replica finished it
      history_ = read_lines(out_ + "/replica.jsonl");
      server_model_ = replica_model_;
    } else {
      history_ = read_lines(out_ + "/server.jsonl");
      server_model_ = read_model(out_ + "/server.model", spec.floats);
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

TEST_F(ShardRun, ServerAndReplicaAreBitwiseEqualAndMatchTheReference) {
  run({});
  const std::uint64_t total = kWorkers * spec_.updates;
  ASSERT_EQ(history_.size(), total);
  std::set<std::pair<std::uint64_t, std::uint64_t>> applied;  // (worker, step)
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1) << "decided out of sequence order";
    EXPECT_FALSE(history_[i]["skipped"].get<bool>()) << "seq " << i + 1;
    applied.insert({history_[i]["worker"].get<std::uint64_t>(), history_[i]["tag"].get<std::uint64_t>()});
  }
  EXPECT_EQ(applied.size(), total) << "an update was applied twice or one is missing";
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_)) << "server and replica diverged";
  EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the server's model is not the granted order applied";
  // The updates really changed the model (a server that applied nothing would match nothing).
  EXPECT_NE(server_model_[0], examples::initial_value(0));
  // No worker was lost (the server stops once every update is in: most have not left yet).
  const json stats = read_lines(out_ + "/server.stats.json").at(0);
  EXPECT_EQ(stats["peers_lost"].get<std::uint64_t>(), 0u);
}

TEST_F(ShardRun, AReplicaThatReadsFromTheServersSlotsStaysBitwiseEqual) {
  // Workers write each update once (to the server); the replica reads every one of them from the
  // server's slot when the server's decision comes. Same guarantees as with mirroring.
  RunSpec spec;
  spec.replica_reads = true;
  spec.floats = 70000;  // 280,000-byte updates: the replica READs each in two pieces (256 KiB + the rest)
  run(spec);
  const std::uint64_t total = kWorkers * spec_.updates;
  ASSERT_EQ(history_.size(), total);
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_)) << "server and replica diverged";
  EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the server's model is not the granted order applied";
  const json replica_stats = read_lines(out_ + "/replica.stats.json").at(0);
  EXPECT_EQ(replica_stats["mirrors_fetched"].get<std::uint64_t>(), total)
      << "every update must have come by a READ from the server, none by a mirror";
}

TEST_F(ShardRun, PullsDuringAppliesAreNeverTorn) {
  // Uniform gradients keep every version of the model uniform; a pull that mixed two versions
  // would show unequal floats. Workers pull before every push while the server applies others'.
  RunSpec spec;
  spec.floats = 32768;
  spec.updates = 60;
  spec.gradient = "uniform";
  run(spec);
  std::uint64_t retries = 0;
  for (std::uint32_t id = 1; id <= kWorkers; ++id) {
    std::ifstream in(out_ + "/worker" + std::to_string(id) + ".json");
    const json report = json::parse(in);
    EXPECT_EQ(report["torn"].get<std::uint64_t>(), 0u) << "worker " << id << " accepted a torn model";
    retries += report["pull_retries"].get<std::uint64_t>();
  }
  // How often a pull met an apply in progress and was read again (measured, not asserted).
  RecordProperty("pull_retries", std::to_string(retries));
  std::printf("pulls read again after meeting an apply: %llu\n", static_cast<unsigned long long>(retries));
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_));
  EXPECT_TRUE(bitwise_equal(server_model_, reference()));
}

TEST_F(ShardRun, AWorkerKilledBetweenGrantAndWriteLeavesAHoleThatIsSkipped) {
  // Worker 4 asks for a slot at its step 5 and dies before writing. The server cancels the
  // hole (the connection's loss tells it at once), skips it in order, tells the replica, and
  // the others' updates after it are applied.
  RunSpec spec;
  spec.die_after[4] = 5;
  run(spec);
  const std::uint64_t expected_applied = 3 * spec_.updates + 5;
  std::uint64_t skipped = 0, applied = 0;
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    (history_[i]["skipped"].get<bool>() ? skipped : applied) += 1;
  }
  EXPECT_EQ(applied, expected_applied);
  EXPECT_EQ(skipped, 1u) << "the dead worker's granted sequence must be skipped exactly once";
  const json stats = read_lines(out_ + "/server.stats.json").at(0);
  EXPECT_EQ(stats["peers_lost"].get<std::uint64_t>(), 1u) << "the dead worker said no bye";
  EXPECT_EQ(stats["peers_left"].get<std::uint64_t>(), kWorkers - 1);
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_));
  EXPECT_TRUE(bitwise_equal(server_model_, reference()));
}

TEST_F(ShardRun, ARestartedWorkerRejoinsTheRunningJobAtServerAndReplica) {
  // Membership: worker 4 asks for a slot at its step 2 and dies (as kill -9 would); a new
  // process started as worker 4 connects to the running server and replica and pushes steps
  // 3 on. The job is not restarted: the others go on, the hole is skipped once, and the
  // restarted worker's updates are applied at the server and mirrored at the replica.
  RunSpec spec;
  spec.updates = 40;
  spec.pace_ms = 150;  // the others push for >= 6 s; the restart comes after ~1.5 s
  spec.die_after[4] = 2;
  spec.restart_worker4 = true;
  run(spec);
  std::set<std::pair<std::uint64_t, std::uint64_t>> applied;  // (worker, step)
  std::uint64_t skipped = 0;
  std::map<std::uint64_t, std::uint64_t> applied_worker;  // sequence -> worker
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    if (history_[i]["skipped"].get<bool>()) {
      ++skipped;
      continue;
    }
    const auto worker = history_[i]["worker"].get<std::uint64_t>(), step = history_[i]["tag"].get<std::uint64_t>();
    EXPECT_TRUE(applied.emplace(worker, step).second) << "worker " << worker << " step " << step << " applied twice";
    applied_worker[i + 1] = worker;
  }
  for (std::uint64_t worker = 1; worker <= kWorkers; ++worker) {
    for (std::uint64_t step = 0; step < spec_.updates; ++step) {
      const bool expected = worker != 4 || step != 2;  // the dead process's step 2 never came
      EXPECT_EQ(applied.contains({worker, step}), expected) << "worker " << worker << " step " << step;
    }
  }
  EXPECT_EQ(skipped, 1u) << "the dead process's granted sequence is skipped once";
  const json report = json::parse(std::ifstream(out_ + "/worker4.json"));  // the restarted process's
  ASSERT_EQ(report["acked"].size(), spec_.updates - 3);
  for (const json& seq : report["acked"]) {
    const auto s = seq.get<std::uint64_t>();
    EXPECT_TRUE(applied_worker.contains(s) && applied_worker.at(s) == 4) << "acknowledged sequence " << s;
  }
  // peers_lost: the dead process said no bye; the server did, at the end (the replica does not
  // count it lost, nor take it for a crash).
  for (const auto& [role, lost] : {std::pair{"server", 1u}, std::pair{"replica", 1u}}) {
    const json stats = read_lines(out_ + "/" + role + ".stats.json").at(0);
    EXPECT_EQ(stats["peers_joined"].get<std::uint64_t>(), 1u) << role;
    EXPECT_EQ(stats["peers_lost"].get<std::uint64_t>(), lost) << role;
  }
  const json server_stats = read_lines(out_ + "/server.stats.json").at(0);
  EXPECT_EQ(server_stats["peers_left"].get<std::uint64_t>(), kWorkers) << "the restarted worker left cleanly";
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_));
  EXPECT_TRUE(bitwise_equal(server_model_, reference()));
}

TEST_F(ShardRun, AWorkerStalledPastItsGrantAsksAgainAndNoAcknowledgedUpdateIsLost) {
  // Worker 4 asks for a slot at its step 5 and stalls 2.5 s before taking the grant up; the
  // server skips a granted sequence not written within 1 s. Writing the stale grant would
  // land in a sequence already skipped, with the push reported a success. The worker must not
  // write it but ask again.
  RunSpec spec;
  spec.hole_timeout_ms = "1000";
  spec.worker4_args = {"stall_after=5", "stall_ms=2500", "grant_lifetime_ms=500"};
  run(spec);
  const json report = json::parse(std::ifstream(out_ + "/worker4.json"));
  EXPECT_GE(report["expired"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(report["lost"].get<std::uint64_t>(), 0u);
  std::uint64_t skipped = 0, applied = 0;
  std::map<std::uint64_t, std::uint64_t> applied_worker;  // sequence -> worker
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    if (history_[i]["skipped"].get<bool>()) {
      ++skipped;
    } else {
      ++applied;
      applied_worker[i + 1] = history_[i]["worker"].get<std::uint64_t>();
    }
  }
  EXPECT_EQ(applied, kWorkers * spec_.updates) << "every update applied, the stalled one included";
  EXPECT_GE(skipped, 1u) << "the expired grant is a hole the server skips";
  for (const json& seq : report["acked"]) {  // every push worker 4 saw succeed was applied as its own
    const auto s = seq.get<std::uint64_t>();
    EXPECT_TRUE(applied_worker.contains(s) && applied_worker.at(s) == 4) << "acknowledged sequence " << s;
  }
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_));
  EXPECT_TRUE(bitwise_equal(server_model_, reference()));
}

TEST_F(ShardRun, WithSidecarsTheReceiversSidecarOwnsTheSequence) {
  // The same run, but every sequence number comes from the server's sidecar (workers on host
  // 1 through the peer protocol), the window B = 8 is fed by the server's applied reports, and
  // the result must still be bitwise what the granted order gives, at server and replica.
  RunSpec spec;
  spec.sidecar = true;
  run(spec);
  const std::uint64_t total = kWorkers * spec_.updates;
  ASSERT_EQ(history_.size(), total);
  std::map<std::uint64_t, std::uint64_t> granted;  // seq -> times granted
  for (const auto& d : read_lines(out_ + "/sidecar-a.jsonl")) {
    if (d["kind"] == "go" && d["origin"] == "here" && d["receiver"] == 0) ++granted[d["seq"].get<std::uint64_t>()];
  }
  for (std::size_t i = 0; i < history_.size(); ++i) {
    const std::uint64_t seq = history_[i]["seq"].get<std::uint64_t>();
    EXPECT_EQ(seq, i + 1);
    EXPECT_FALSE(history_[i]["skipped"].get<bool>());
    EXPECT_EQ(granted[seq], 1u) << "seq " << seq << " was not granted exactly once by the receiver's sidecar";
  }
  EXPECT_EQ(granted.size(), total);
  // The server that finished said so: its replica did not take the end of the job for a crash
  // (in sidecar mode that would move the sequence to gradlaned B, which stands by for it).
  EXPECT_EQ(read_lines(out_ + "/replica.stats.json").at(0)["promoted_at_ns"].get<std::int64_t>(), 0);
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_)) << "server and replica diverged";
  EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the server's model is not the granted order applied";
}

TEST_F(ShardRun, WithSidecarsAndGrantWindowsEveryPushClaimsItsSlotAndTheModelIsTheGrantedOrder) {
  // The server gives gradlaned A a grant key; every grant of its sequence carries a token —
  // stamped by A for workers 1 and 2 (host 2, A's own apps) and sent over the peer link to B
  // for workers 3 and 4 (host 1). Each push claims its slot with it before writing: a worker
  // without the right token could not write at all (the ring's key opens it for reading only).
  RunSpec spec;
  spec.sidecar = true;
  spec.grant_windows = true;
  run(spec);
  const std::uint64_t total = kWorkers * spec_.updates;
  ASSERT_EQ(history_.size(), total);
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    EXPECT_FALSE(history_[i]["skipped"].get<bool>());
  }
  for (const char* role : {"server", "replica"}) {
    const json stats = read_lines(out_ + "/" + role + ".stats.json").at(0);
    EXPECT_EQ(stats["claimed"].get<std::uint64_t>(), total) << role << ": a push or mirror that did not claim its slot";
    EXPECT_EQ(stats["refused_claims"].get<std::uint64_t>(), 0u) << role;
    EXPECT_EQ(stats["refused_doorbells"].get<std::uint64_t>(), 0u) << role;
  }
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_)) << "server and replica diverged";
  EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the server's model is not the granted order applied";
}

TEST_F(ShardRun, WithGrantWindowsEveryMirrorClaimsItsSlotAtTheReplica) {
  // Direct mode: the server binds each grant's window itself and hands the worker its token,
  // which the worker claims its mirror's slot at the replica with (the replica learned the
  // server's key on connect). A worker that did not claim could not mirror at all.
  RunSpec spec;
  spec.grant_windows = true;
  run(spec);
  const std::uint64_t total = kWorkers * spec_.updates;
  ASSERT_EQ(history_.size(), total);
  const json replica = read_lines(out_ + "/replica.stats.json").at(0);
  EXPECT_EQ(replica["claimed"].get<std::uint64_t>(), total) << "a mirror that did not claim its slot";
  EXPECT_EQ(replica["refused_claims"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(replica["mirrors_fetched"].get<std::uint64_t>(), 0u) << "every mirror landed";
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_)) << "server and replica diverged";
  EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the server's model is not the granted order applied";
}

TEST_F(ShardRun, WithGrantWindowsAReplicaThatReadsFromTheServersSlotsStaysBitwiseEqual) {
  // A windowed ring is opened by no key for writing, but the replica READs into its own slots
  // (here every update, from the server's slot; elsewhere a mirror that never came): its ring
  // must be a READ destination (a replica that joins a running server READs into it too).
  RunSpec spec;
  spec.grant_windows = true;
  spec.replica_reads = true;
  run(spec);
  const std::uint64_t total = kWorkers * spec_.updates;
  ASSERT_EQ(history_.size(), total);
  EXPECT_EQ(read_lines(out_ + "/replica.stats.json").at(0)["mirrors_fetched"].get<std::uint64_t>(), total);
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_)) << "server and replica diverged";
}

TEST_F(ShardRun, WithSidecarsADeadWorkersGrantedSequenceIsCancelledBySidecar) {
  // Worker 1 (sidecar A, the receiver's own) and worker 4 (sidecar B, through the peer
  // protocol) each ask for a slot and die. Their sidecars reclaim them; the receiver's sidecar
  // cancels each sequence it had granted them; the server skips those in order.
  RunSpec spec;
  spec.sidecar = true;
  spec.die_after[1] = 5;
  spec.die_after[4] = 7;
  spec.hole_timeout_ms = "60000";  // so a skip can only come from the sidecar's cancel
  run(spec);
  std::uint64_t skipped = 0, applied = 0;
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    (history_[i]["skipped"].get<bool>() ? skipped : applied) += 1;
  }
  EXPECT_EQ(applied, 2 * spec_.updates + 5 + 7);
  std::uint64_t cancels = 0;
  for (const auto& d : read_lines(out_ + "/sidecar-a.jsonl")) cancels += d["kind"] == "cancel";
  EXPECT_EQ(skipped, cancels) << "every skip must be a cancel from the receiver's sidecar";
  EXPECT_LE(skipped, 2u);
  EXPECT_TRUE(bitwise_equal(server_model_, replica_model_));
  EXPECT_TRUE(bitwise_equal(server_model_, reference()));
}

TEST_F(ShardRun, AWorkerGivenTheReplicasAddressAsItsServersIsRefusedAndTheServerGoesOn) {
  // A misconfigured worker must not look like a link flap: the replica refuses its request, to
  // it alone, and the job runs on at the server with its replica.
  RunSpec spec;
  spec.worker4_addresses_the_replica = true;
  run(spec);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_TRUE(wait_for_text(out_ + "/worker4.err", "this is the shard's replica, and its server lives",
                            std::chrono::seconds(1)))
      << "worker 4 was not told why";
  const json server_stats = read_lines(out_ + "/server.stats.json").at(0);
  EXPECT_FALSE(server_stats["stepped_down"].get<bool>());
  const json replica_stats = read_lines(out_ + "/replica.stats.json").at(0);
  EXPECT_EQ(replica_stats["promoted_at_ns"].get<std::int64_t>(), 0) << "the replica was promoted";
  EXPECT_EQ(replica_stats["refused_requests"].get<std::uint64_t>(), 1u);
  EXPECT_TRUE(bitwise_equal(server_model_, reference()));
  EXPECT_TRUE(bitwise_equal(replica_model_, server_model_));
  for (std::uint32_t id = 1; id < kWorkers; ++id) {
    std::ifstream in(out_ + "/worker" + std::to_string(id) + ".json");
    EXPECT_EQ(json::parse(in)["failovers"].get<std::uint64_t>(), 0u) << "worker " << id;
  }
  EXPECT_EQ(history_.size(), (kWorkers - 1) * spec_.updates) << "every push of the three others, nothing else";
}

TEST_F(ShardRun, AWorkerThatFailedOverWhileTheServerLivesMakesTheServerStepDown) {
  // The split a link flap made (workers failed over while the server lived on, and both
  // finished with a model of their own): the replica tells the server, which stops granting,
  // finishes what it granted and goes; the replica, promoted, serves every worker to the end.
  RunSpec spec;
  spec.host2_cut_from_server = true;
  // Workers 3 and 4 still push when 1 and 2 fail over (within the ACK timeout's retries, about
  // a second): a server whose other workers all finished would end the job instead.
  spec.pace_ms = 150;
  run(spec);
  ASSERT_FALSE(HasFatalFailure());
  const json server_stats = read_lines(out_ + "/server.stats.json").at(0);
  EXPECT_TRUE(server_stats["stepped_down"].get<bool>());
  const json replica_stats = read_lines(out_ + "/replica.stats.json").at(0);
  EXPECT_GT(replica_stats["promoted_at_ns"].get<std::int64_t>(), 0) << "the replica was never promoted";
  // One history, gap-free, its model exactly that history applied, every acknowledged push in it.
  std::map<std::uint64_t, std::uint64_t> applied_by;  // sequence -> the worker the history names
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    if (!history_[i]["skipped"].get<bool>()) {
      applied_by[history_[i]["seq"].get<std::uint64_t>()] = history_[i]["worker"].get<std::uint64_t>();
    }
  }
  EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the promoted replica's model is not its history applied";
  std::uint64_t reported_lost = 0;
  for (std::uint32_t id = 1; id <= kWorkers; ++id) {
    std::ifstream in(out_ + "/worker" + std::to_string(id) + ".json");
    const json report = json::parse(in);
    // 1 and 2 when their link went, 3 and 4 when the server stepped down and left.
    EXPECT_EQ(report["failovers"].get<std::uint64_t>(), 1u) << "worker " << id;
    reported_lost += report["lost"].get<std::uint64_t>();
    for (const json& sequence : report["acked"]) {
      const auto at = applied_by.find(sequence.get<std::uint64_t>());
      EXPECT_TRUE(at != applied_by.end() && at->second == id)
          << "worker " << id << "'s acknowledged update " << sequence << " is not in the job's history";
    }
  }
  EXPECT_LE(reported_lost, kWorkers) << "at most the push each worker had waiting at the server";
  EXPECT_EQ(applied_by.size() + reported_lost, kWorkers * spec_.updates) << "an update vanished unreported";
}

TEST_F(ShardRun, WhenTheServerIsKilledTheReplicaTakesOverWithinThreeSeconds) {
  // The server SIGKILLs itself after applying 50 updates. The replica must see it, become the
  // server at the version it reached, and the workers must fail over to it and finish.
  RunSpec spec;
  spec.updates = 40;
  spec.server_dies_at = 50;
  run(spec);
  const auto [died_at_version, takeover_s] = takeover();
  ASSERT_FALSE(HasFailure());
  RecordProperty("takeover_ms", std::to_string(static_cast<int>(takeover_s * 1000)));
  std::printf("replica promoted %.3f s after the server died\n", takeover_s);
  EXPECT_LT(takeover_s, 3.0);

  // The new server's history is gap-free and its model is exactly that history applied.
  std::uint64_t applied = 0;
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    applied += history_[i]["skipped"].get<bool>() ? 0 : 1;
  }
  EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the promoted replica's model is not its history applied";
  // Updates lost without their worker knowing (written, then the server died before the
  // replica heard its decision) are at most B = 8; pushes in flight at the crash are reported
  // lost to their workers.
  std::uint64_t reported_lost = 0;
  std::map<std::uint64_t, std::uint64_t> applied_by;  // sequence -> the worker the history names
  for (const json& u : history_) {
    if (!u["skipped"].get<bool>()) applied_by[u["seq"].get<std::uint64_t>()] = u["worker"].get<std::uint64_t>();
  }
  for (std::uint32_t id = 1; id <= kWorkers; ++id) {
    std::ifstream in(out_ + "/worker" + std::to_string(id) + ".json");
    const json report = json::parse(in);
    EXPECT_EQ(report["failovers"].get<std::uint64_t>(), 1u) << "worker " << id;
    reported_lost += report["lost"].get<std::uint64_t>();
    // A push its worker saw succeed is never lost: the promoted replica holds its mirror (the
    // worker wrote it there first) and applies it even when the server died before deciding it.
    for (const json& sequence : report["acked"]) {
      const auto at = applied_by.find(sequence.get<std::uint64_t>());
      EXPECT_TRUE(at != applied_by.end() && at->second == id)
          << "worker " << id << "'s acknowledged update " << sequence << " is not in the promoted replica's history";
    }
  }
  const std::uint64_t pushed = kWorkers * spec_.updates;
  ASSERT_LE(applied + reported_lost, pushed);
  EXPECT_LE(pushed - reported_lost - applied, 8u) << "more than B updates lost silently";
  EXPECT_GT(applied, died_at_version) << "training did not continue after the failover";
}

TEST_F(ShardRun, AcknowledgedPushesBehindAHoleAreAppliedByThePromotedReplica) {
  // Worker 4 takes its grant at step 5 and stalls (as SIGSTOP would) past its grant_lifetime;
  // the server waits on that hole (hole_timeout 60 s) while the others' later pushes are
  // written to it and to the replica, acknowledged, and wait behind the hole, until the window
  // is full (7 behind the hole, 8 slots) and the server dies. The promoted replica skips the hole and applies those
  // mirrors; worker 4 does not write its stale grant and reports that push lost.
  RunSpec spec;
  spec.hole_timeout_ms = "60000";
  spec.server_dies_behind_hole = 7;
  spec.worker4_args = {"stall_after=5", "stall_ms=3000", "grant_lifetime_ms=500"};
  run(spec);
  const json stats = read_lines(out_ + "/replica.stats.json").at(0);
  EXPECT_EQ(stats["lost_in_failover"].get<std::uint64_t>(), 0u) << "acknowledged mirrors were not applied";
  std::map<std::uint64_t, std::uint64_t> applied_by;  // sequence -> the worker the history names
  std::uint64_t first_hole = 0;
  for (std::size_t i = 0; i < history_.size(); ++i) {
    ASSERT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    if (!history_[i]["skipped"].get<bool>()) {
      applied_by[i + 1] = history_[i]["worker"].get<std::uint64_t>();
    } else if (first_hole == 0) {
      first_hole = i + 1;
    }
  }
  ASSERT_NE(first_hole, 0u) << "worker 4's held grant must be skipped";
  std::uint64_t acked_behind_the_hole = 0;
  for (std::uint32_t id = 1; id <= kWorkers; ++id) {
    const json report = json::parse(std::ifstream(out_ + "/worker" + std::to_string(id) + ".json"));
    EXPECT_EQ(report["failovers"].get<std::uint64_t>(), 1u) << "worker " << id;
    for (const json& sequence : report["acked"]) {
      const auto s = sequence.get<std::uint64_t>();
      const auto at = applied_by.find(s);
      EXPECT_TRUE(at != applied_by.end() && at->second == id)
          << "worker " << id << "'s acknowledged push " << s << " is not in the promoted replica's history";
      acked_behind_the_hole += s > first_hole && s < first_hole + 8 ? 1 : 0;
    }
  }
  // The 7 behind the hole had arrived at the server, their mirrors written first: the server's
  // NIC acknowledged each write before its doorbell was seen, so nearly all are acknowledged.
  EXPECT_GE(acked_behind_the_hole, 4u) << "the scenario did not hold acknowledged pushes behind the hole";
  const json worker4 = json::parse(std::ifstream(out_ + "/worker4.json"));
  EXPECT_GE(worker4["lost"].get<std::uint64_t>(), 1u) << "its stale grant's push must report lost";
  EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the promoted replica's model is not its history applied";
}

TEST_F(ShardRun, ANewReplicaJoinsThePromotedServerAndEndsBitwiseEqualToIt) { a_new_replica_joins_and_follows(""); }

TEST_F(ShardRun, WithMomentumANewReplicaJoinsWithTheServersVelocityAndEndsBitwiseEqual) {
  // The same with SGD with momentum 0.9: the joined replica must take the server's velocity
  // along with its model, or its first apply already differs (and the two models drift apart).
  a_new_replica_joins_and_follows("0.9");
}

TEST_F(ShardRun, WorkersMirrorToAJoinedReplicaAndFailOverToItWhenThePromotedServerDiesToo) {
  // As above, and then the promoted replica dies too (SIGKILL at version 110). The workers,
  // told by it where the joined replica listens, connected to it and mirror there: it is
  // promoted in turn, every worker fails over a second time, and the job ends there. Every push
  // a worker saw succeed is in the job's history as that worker's, the history has no gap, and
  // the final model is exactly that history applied (bitwise).
  RunSpec spec;
  spec.updates = 40;
  spec.server_dies_at = 50;
  spec.pace_ms = 150;
  spec.new_replica_joins = true;
  spec.promoted_dies_at = 110;
  run(spec);
  ASSERT_FALSE(HasFatalFailure());
  for (std::size_t i = 0; i < history_.size(); ++i) EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
  const json second = read_lines(out_ + "/replica2.stats.json").at(0);
  EXPECT_GT(second["promoted_at_ns"].get<std::int64_t>(), 0) << "the joined replica was not promoted";
  EXPECT_GT(history_.size(), 115u) << "the job did not go on after the second failover";
  EXPECT_TRUE(bitwise_equal(server_model_, reference())) << "the final model is not the job's history applied";
  std::map<std::uint64_t, std::uint64_t> applied_by;
  for (const json& u : history_) {
    if (!u["skipped"].get<bool>()) applied_by[u["seq"].get<std::uint64_t>()] = u["worker"].get<std::uint64_t>();
  }
  for (std::uint32_t id = 1; id <= kWorkers; ++id) {
    std::ifstream in(out_ + "/worker" + std::to_string(id) + ".json");
    const json report = json::parse(in);
    EXPECT_EQ(report["failovers"].get<std::uint64_t>(), 2u) << "worker " << id;
    for (const json& sequence : report["acked"]) {
      const auto at = applied_by.find(sequence.get<std::uint64_t>());
      EXPECT_TRUE(at != applied_by.end() && at->second == id)
          << "worker " << id << "'s acknowledged update " << sequence << " is not in the job's history";
    }
  }
}

TEST_F(ShardRun, WithSidecarsWhenTheServerIsKilledTheReplicasSidecarTakesTheSequenceOver) {
  // Sidecar mode: the server SIGKILLs itself after applying 50 updates. The replica is
  // promoted and attaches to its host's gradlaned (B, --standby 0:1) to take the server's
  // sequence over there, `slots` (8) past the version it reached; A drops what waited for the
  // dead server (receiver_moved) and every later request for endpoint 0 goes to B. The run must
  // finish with every acknowledged push in the promoted replica's history, its model exactly
  // that history applied, at most B lost silently, and sequences after the takeover granted by
  // B alone, each once. The promoted replica stalls 500 ms right after it took over (a loaded
  // host), while B grants at once and workers 3 and 4, on its host, write: their doorbells must
  // find the window already past the old owner's sequences (they were refused, silently, and
  // the pushes acknowledged: three lost in a CI run, before the takeover skipped first).
  RunSpec spec;
  spec.sidecar = true;
  spec.updates = 40;
  spec.server_dies_at = 50;
  spec.promoted_stalls_ms = 500;
  run(spec);
  const auto [died_at_version, takeover_s] = takeover();
  ASSERT_FALSE(HasFailure());
  std::printf("replica promoted %.3f s after the server died (sidecar mode)\n", takeover_s);
  EXPECT_LT(takeover_s, 3.0);

  // B took over: the sequences it granted start at the takeover point, each once, and A granted
  // none of those.
  std::uint64_t first_at_b = 0;
  std::map<std::uint64_t, std::uint64_t> granted_at_b;
  for (const auto& d : read_lines(out_ + "/sidecar-b.jsonl")) {
    if (d["kind"] == "go" && d["origin"] == "here" && d["receiver"] == 0) {
      const auto seq = d["seq"].get<std::uint64_t>();
      ++granted_at_b[seq];
      first_at_b = first_at_b == 0 ? seq : std::min(first_at_b, seq);
    }
  }
  ASSERT_FALSE(granted_at_b.empty()) << "B never granted the promoted server a sequence";
  for (const auto& [seq, times] : granted_at_b) EXPECT_EQ(times, 1u) << "seq " << seq;
  std::uint64_t last_at_a = 0;
  for (const auto& d : read_lines(out_ + "/sidecar-a.jsonl")) {
    if (d["kind"] == "go" && d["origin"] == "here" && d["receiver"] == 0) {
      last_at_a = std::max(last_at_a, d["seq"].get<std::uint64_t>());
    }
  }
  EXPECT_LT(last_at_a, first_at_b) << "A granted a sequence B also hands out";

  // One gap-free history; its model is exactly that history applied.
  std::uint64_t applied = 0;
  std::map<std::uint64_t, std::uint64_t> applied_by;  // sequence -> worker
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    if (!history_[i]["skipped"].get<bool>()) {
      ++applied;
      applied_by[history_[i]["seq"].get<std::uint64_t>()] = history_[i]["worker"].get<std::uint64_t>();
    }
  }
  std::uint64_t reported_lost = 0, dropped = 0, acked = 0;
  std::map<std::uint64_t, std::uint64_t> steps;  // sequence -> step, of the acknowledged pushes
  for (std::uint32_t id = 1; id <= kWorkers; ++id) {
    std::ifstream in(out_ + "/worker" + std::to_string(id) + ".json");
    const json report = json::parse(in);
    EXPECT_EQ(report["failovers"].get<std::uint64_t>(), 1u) << "worker " << id;
    reported_lost += report["lost"].get<std::uint64_t>();
    dropped += report["dropped"].get<std::uint64_t>();
    for (const json& pair : report["acked_steps"]) steps[pair[0].get<std::uint64_t>()] = pair[1].get<std::uint64_t>();
    acked += report["acked"].size();
    for (const json& sequence : report["acked"]) {
      const auto at = applied_by.find(sequence.get<std::uint64_t>());
      EXPECT_TRUE(at != applied_by.end() && at->second == id)
          << "worker " << id << "'s acknowledged update " << sequence << " is not in the promoted replica's history";
    }
  }
  EXPECT_TRUE(bitwise_equal(server_model_, reference(steps)))
      << "the promoted replica's model is not its history applied";
  // Every push is acknowledged, dropped or reported lost; every acknowledged one was applied
  // (checked above, by sequence), and what else was applied is some of the reported lost ones
  // (a mirror the promoted replica held: "lost" means not known to be applied).
  EXPECT_EQ(acked + dropped + reported_lost, kWorkers * spec_.updates);
  EXPECT_LE(applied, acked + reported_lost) << "applied more updates than were pushed";
  EXPECT_GT(applied, died_at_version) << "training did not continue after the failover";
}

TEST_F(ShardRun, WithSidecarsARestartedServerSidecarHoldsTheSequenceUntilTheServerTakesItOver) {
  // Sidecar mode: the server's gradlaned (A) is SIGKILLed mid-run and started again. The server
  // lives on: the new A finds it in its predecessor's segment and holds its receiver; the
  // server attaches again taking its own sequence over, `slots` past where it is. Workers 1
  // and 2 (A's) reattach; 3 and 4 (B's) go on, their requests forwarded to A again once B's
  // link to it is back. Nobody fails over; every acknowledged push is in the server's history
  // (a write of a grant the dead A made, arriving after the takeover, is refused and reported
  // lost: the workers read the server's refusal floor); the model is exactly that history
  // applied, and the replica's equal to it. (Here the server usually attaches before any
  // worker's request reaches the new A, so the hold is rarely what keeps them apart; unit's
  // SidecarRestart.ANewDaemonHoldsASurvivingServers… checks the hold itself.)
  RunSpec spec;
  spec.sidecar = true;
  spec.updates = 40;
  spec.pace_ms = 100;                        // the job outlasts the restart by seconds
  spec.restart_sidecar_a_after_grants = 20;  // of the 160 pushes: the job outlasts the restart
  // Time for the new A to come up under TCG — under ASan it has taken more than 5 s from the
  // kill — for every app that reattaches (the server's takeover too), and for B's workers,
  // whose requests B refuses while A is away, before a refusal is an error: 15 s, not 2 and 5.
  spec.every_worker_args = {"failover_patience_ms=15000"};
  ::setenv("GRADLANE_SIDECAR_TIMEOUT_MS", "15000", 1);
  run(spec);
  ::unsetenv("GRADLANE_SIDECAR_TIMEOUT_MS");
  ASSERT_FALSE(HasFatalFailure());
  const json server = read_lines(out_ + "/server.stats.json").at(0);
  EXPECT_EQ(server["sidecars_resumed"].get<std::uint64_t>(), 1u) << "the server did not take its sequence over";
  EXPECT_EQ(server["promoted_at_ns"].get<std::int64_t>(), 0) << "the replica was promoted";
  std::map<std::uint64_t, std::uint64_t> applied_by, steps;
  for (std::size_t i = 0; i < history_.size(); ++i) {
    EXPECT_EQ(history_[i]["seq"].get<std::uint64_t>(), i + 1);
    if (!history_[i]["skipped"].get<bool>()) {
      applied_by[history_[i]["seq"].get<std::uint64_t>()] = history_[i]["worker"].get<std::uint64_t>();
    }
  }
  std::uint64_t acked = 0;
  for (std::uint32_t id = 1; id <= kWorkers; ++id) {
    std::ifstream in(out_ + "/worker" + std::to_string(id) + ".json");
    const json report = json::parse(in);
    EXPECT_EQ(report["failovers"].get<std::uint64_t>(), 0u) << "worker " << id;
    for (const json& pair : report["acked_steps"]) steps[pair[0].get<std::uint64_t>()] = pair[1].get<std::uint64_t>();
    acked += report["acked"].size();
    for (const json& sequence : report["acked"]) {
      const auto at = applied_by.find(sequence.get<std::uint64_t>());
      EXPECT_TRUE(at != applied_by.end() && at->second == id)
          << "worker " << id << "'s acknowledged update " << sequence << " is not in the server's history";
    }
  }
  EXPECT_GT(acked, kWorkers * spec.updates / 2) << "too little went through to show the job went on";
  EXPECT_TRUE(bitwise_equal(server_model_, reference(steps))) << "the server's model is not its history applied";
  EXPECT_TRUE(bitwise_equal(replica_model_, server_model_)) << "server and replica diverged";
  // The new A handed out the server's sequence from the takeover on: past everything the dead
  // one granted.
  std::uint64_t last_first_life = 0, first_second_life = ~std::uint64_t{0};
  for (const auto& d : read_lines(out_ + "/sidecar-a.jsonl")) {
    if (d["kind"] == "go" && d["receiver"] == 0)
      last_first_life = std::max(last_first_life, d["seq"].get<std::uint64_t>());
  }
  for (const auto& d : read_lines(out_ + "/sidecar-a2.jsonl")) {
    if (d["kind"] == "go" && d["receiver"] == 0)
      first_second_life = std::min(first_second_life, d["seq"].get<std::uint64_t>());
  }
  EXPECT_GT(last_first_life, 0u);
  EXPECT_LT(last_first_life, first_second_life) << "the restarted gradlaned handed out a number the dead one had";
}

}  // namespace
}  // namespace gradlane::testing

namespace gradlane::testing {
namespace {

// A hand-driven worker: the test process speaks the shard's protocol itself, so it can also
// misbehave on purpose.
class RogueWorkers : public ::testing::Test {
 protected:
  static constexpr std::size_t kFloats = 1024, kBytes = kFloats * sizeof(float);

  // Connects as worker `id`: the server's slot ring as it advertised it, then our hello.
  static std::pair<Connection, RegionDescriptor> join(const Device& device, const std::string& address,
                                                      std::uint16_t port, std::uint32_t id) {
    Connection c = ps::connect_with_retry(device, address, port, TransportOptions{}, 30s);
    const RegionDescriptor slots = c.wait_region(ps::kSlotRegionId, 30s);
    c.send(ps::encode(ps::Hello{ps::PeerKind::worker, id}));
    return {std::move(c), slots};
  }

  // The server's stats once it finished (every worker gone), after a clean exit.
  static json finished_stats(ExternalProcess& server, const std::string& out) {
    const auto status = server.wait_exit(60s);
    EXPECT_TRUE(status.has_value()) << "the server did not finish";
    EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    std::ifstream stats_file(out + "/server.stats.json");
    return json::parse(stats_file);
  }

  // A fresh output directory under GRADLANE_OUT_DIR.
  static std::string fresh_out(const char* name) {
    const std::string out = std::string(std::getenv("GRADLANE_OUT_DIR")) + "/" + name;
    std::filesystem::remove_all(out);
    std::filesystem::create_directories(out);
    return out;
  }

  // What a rogue writes (1e30s) and what an honest worker pushes (1.0s), registered on `device`.
  struct Payloads {
    explicit Payloads(const Device& device)
        : junk(filled(1e30F)),
          gradient(filled(1.0F)),
          junk_mr(MemoryRegion::register_buffer(device, junk, Access::local)),
          gradient_mr(MemoryRegion::register_buffer(device, gradient, Access::local)) {}
    static Buffer filled(float value) {
      Buffer b = Buffer::allocate(kBytes);
      std::fill_n(reinterpret_cast<float*>(b.data()), kFloats, value);
      return b;
    }
    Buffer junk, gradient;  // before the regions: they outlive them
    MemoryRegion junk_mr, gradient_mr;
  };

  // The model moved by exactly one update of 1.0s from the initial one.
  static void expect_moved_by_one_update(const std::string& out, const char* otherwise) {
    std::vector<float> expected(kFloats, examples::initial_value(0)), one(kFloats, 1.0F);
    ps::sgd_step(expected, one, examples::kLearningRate);
    const auto model = read_model(out + "/server.model", kFloats);
    EXPECT_EQ(std::memcmp(model.data(), expected.data(), kBytes), 0) << otherwise;
  }
};

TEST_F(RogueWorkers, BadDoorbellsAndMalformedMessagesAreRefusedAndTheModelIsUntouched) {
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue");
  ExternalProcess server({GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7810",
                          "floats=" + std::to_string(kFloats), "slots=8", "workers=2", "updates=1", "out=" + out},
                         out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto [good, slots] = join(device, hosts[0].address, 7810, 1);
  auto [bad, bad_slots] = join(device, hosts[0].address, 7810, 2);
  (void)bad_slots;

  const Payloads payloads(device);
  const MemoryRegion &junk_mr = payloads.junk_mr, &gradient_mr = payloads.gradient_mr;

  // 1. A doorbell for a sequence never granted (5): refused, its slot never applied.
  good.wait(good.write_and_ring(junk_mr, 0, slots, 5 * kBytes, kBytes, 5), 30s);
  // 2. The one legitimate push: request, grant, write, doorbell.
  good.send(ps::encode(ps::Request{1, 0, 0}));
  const ps::Message answer = ps::decode(good.receive(30s));
  ASSERT_TRUE(std::holds_alternative<ps::Grant>(answer));
  const std::uint64_t seq = std::get<ps::Grant>(answer).sequence;
  EXPECT_EQ(seq, 1u);
  good.wait(good.write_and_ring(gradient_mr, 0, slots, (seq % 8) * kBytes, kBytes, static_cast<std::uint32_t>(seq)),
            30s);
  // 3. The same doorbell again (a replay of an applied or arrived sequence): refused.
  good.wait(good.write_with_imm(gradient_mr, 0, slots, 0, 0, static_cast<std::uint32_t>(seq)), 30s);
  // 4. A malformed message on the other connection: that peer is dropped, nobody else is.
  const std::vector<std::byte> garbage(7, std::byte{0xee});
  bad.send(garbage);
  bad.flush(30s);
  good.send(ps::encode(ps::Bye{1}));  // the good one says it finished: it leaves, not lost
  good.flush(30s);
  std::this_thread::sleep_for(500ms);  // let the server take all of it before we leave
  { Connection leave_good = std::move(good); }
  { Connection leave_bad = std::move(bad); }

  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(stats["refused_doorbells"].get<std::uint64_t>(), 2u);
  EXPECT_EQ(stats["peers_lost"].get<std::uint64_t>(), 1u) << "the sender of the malformed message";
  expect_moved_by_one_update(out, "a refused doorbell changed the model");  // the one legitimate update
}

TEST_F(RogueWorkers, WithGrantWindowsAWorkerWritesOnlyItsGrantedSlotWhileItsGrantLasts) {
  // The victim (worker 1) writes its update into its granted slot and, before it rings, two
  // rogues try to overwrite that slot: worker 2 with the ring's own key, worker 3 with the key
  // of its own grant. Then the victim rings; afterwards it tries its key again (too late: the
  // update is in), and worker 4 writes a grant it let expire. Every rogue write is refused by
  // the NIC, and the model moves by exactly the victim's update.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-windows");
  ExternalProcess server(
      {GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7811", "floats=" + std::to_string(kFloats),
       "slots=8", "workers=4", "updates=1", "out=" + out, "grant_windows=1", "hole_timeout_ms=500"},
      out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto join = [&](std::uint32_t id) { return RogueWorkers::join(device, hosts[0].address, 7811, id); };
  auto grant_for = [](Connection& c, std::uint32_t id) {
    c.send(ps::encode(ps::Request{id, 0, 0}));
    const ps::Message answer = ps::decode(c.receive(30s));
    EXPECT_TRUE(std::holds_alternative<ps::Grant>(answer));
    return std::get<ps::Grant>(answer);
  };
  auto [victim, slots] = join(1);
  auto [ring_key_rogue, ring1] = join(2);
  auto [other_grant_rogue, ring2] = join(3);
  auto [late, ring3] = join(4);
  (void)ring1, (void)ring2, (void)ring3;

  const Payloads payloads(device);
  const MemoryRegion &junk_mr = payloads.junk_mr, &gradient_mr = payloads.gradient_mr;

  const ps::Grant mine = grant_for(victim, 1);
  ASSERT_EQ(mine.sequence, 1u);
  ASSERT_NE(mine.window_rkey, 0u) << "a windowed server's grant carries a window key";
  EXPECT_NE(mine.window_rkey, slots.rkey);
  const RegionDescriptor my_slot{slots.addr + (mine.sequence % 8) * kBytes, kBytes, mine.window_rkey};
  EXPECT_EQ(refusal_of(victim, victim.write(gradient_mr, 0, my_slot, 0, kBytes, Signal::always)), "landed");

  // The ring's own key opens the ring for reading only.
  EXPECT_EQ(refusal_of(ring_key_rogue,
                       ring_key_rogue.write(junk_mr, 0, slots, (mine.sequence % 8) * kBytes, kBytes, Signal::always)),
            "remote_access");
  // A key of another grant opens that grant's slot only.
  const ps::Grant theirs = grant_for(other_grant_rogue, 3);
  ASSERT_NE(theirs.window_rkey, 0u);
  EXPECT_NE(theirs.sequence % 8, mine.sequence % 8);
  EXPECT_EQ(
      refusal_of(other_grant_rogue, other_grant_rogue.write(junk_mr, 0, {my_slot.addr, kBytes, theirs.window_rkey}, 0,
                                                            kBytes, Signal::always)),
      "remote_access");

  // The victim rings (a doorbell alone): the server applies what is in the slot.
  victim.wait(victim.write_with_imm(gradient_mr, 0, my_slot, 0, 0, static_cast<std::uint32_t>(mine.sequence)), 30s);
  std::this_thread::sleep_for(300ms);  // the server takes the doorbell and closes the window
  EXPECT_EQ(refusal_of(victim, victim.write(junk_mr, 0, my_slot, 0, kBytes, Signal::always)), "remote_access")
      << "the key of a grant whose update arrived must be dead";

  // A grant held past the hole timeout (500 ms) is skipped, and its key dies with it.
  const ps::Grant stale = grant_for(late, 4);
  ASSERT_NE(stale.window_rkey, 0u);
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(
      refusal_of(late, late.write(junk_mr, 0, {slots.addr + (stale.sequence % 8) * kBytes, kBytes, stale.window_rkey},
                                  0, kBytes, Signal::always)),
      "remote_access")
      << "the key of a skipped grant must be dead";

  { Connection leave = std::move(victim); }
  { Connection leave = std::move(ring_key_rogue); }
  { Connection leave = std::move(other_grant_rogue); }
  { Connection leave = std::move(late); }
  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u);
  EXPECT_GE(stats["skipped"].get<std::uint64_t>(), 1u) << "the late worker's grant";
  expect_moved_by_one_update(out, "a refused write changed the model");
}

TEST_F(RogueWorkers, WithSidecarGrantWindowsOnlyTheGranteeOpensItsSlotAndOnlyOnce) {
  // Sidecar mode: the server does not grant, gradlaned does, so the server cannot know whom a
  // sequence went to — only that the one who shows the grant's token is its grantee. The
  // victim (worker 1) is granted sequence 1 and writes it. Rogues of the same job (they hold
  // the job key, so they have connections): one claims it with a forged token, one with the
  // victim's own token replayed after the victim claimed it, one writes with the ring's key,
  // one with the key of its own claimed grant (sequence 2), one rings the victim's doorbell.
  // Each is refused — the claims by the server, the writes by the NIC — and the model moves
  // by exactly the victim's update.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-sidecar-windows"), shm = "/gradlane-test-rogue-windows";
  ExternalProcess daemon({GRADLANE_GRADLANED, "--foreground", "--shm-name", shm}, out + "/gradlaned");
  ASSERT_TRUE(wait_for_text(out + "/gradlaned.err", "gradlaned: serving", 120s));
  ExternalProcess server({GRADLANE_PS_NODE, "role=server", "device=" + hosts[0].device, "port=7812",
                          "floats=" + std::to_string(kFloats), "slots=8", "workers=6", "updates=1", "out=" + out,
                          "sidecar=" + shm, "endpoint=0", "grant_windows=1", "hole_timeout_ms=60000"},
                         out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto join = [&](std::uint32_t id) { return RogueWorkers::join(device, hosts[0].address, 7812, id); };
  auto [victim, slots] = join(1);
  auto [forger, ring1] = join(2);
  auto [replayer, ring2] = join(3);
  auto [ring_key_rogue, ring3] = join(4);
  auto [other_grant_rogue, ring4] = join(5);
  auto [bell_rogue, ring5] = join(6);
  (void)ring1, (void)ring2, (void)ring3, (void)ring4, (void)ring5;

  // Grants from the server's gradlaned, as the job's apps on host 2 (endpoint 2) get them.
  sidecar::AttachOptions attach;
  attach.shm_name = shm;
  attach.job = 1;
  attach.endpoint = 2;
  attach.region_bytes = kBytes;
  sidecar::Client apps = sidecar::Client::attach(attach);
  auto grant = [&] {
    apps.request({.tensor = 1, .receiver = 0, .bytes = kBytes});
    const sidecar::Grant g = apps.wait(30s);
    EXPECT_EQ(g.kind, sidecar::GrantKind::go) << sidecar::reason_name(g.reason);
    EXPECT_NE(g.token, 0u) << "a grant of a server with grant windows carries a token";
    return g;
  };
  auto claim = [](Connection& c, std::uint64_t sequence, std::uint64_t token) {
    c.send(ps::encode(ps::Claim{sequence, token}));
    const ps::Message answer = ps::decode(c.receive(30s));
    EXPECT_TRUE(std::holds_alternative<ps::Opened>(answer));
    return std::get<ps::Opened>(answer);
  };
  // Whether the server dropped `c` (its answer to a refused claim): the next receive fails.
  auto dropped = [](Connection& c) {
    try {
      (void)c.receive(10s);
      return false;
    } catch (const Error& e) {
      std::printf("  [dropped] %s\n", e.what());
      return true;
    }
  };

  const Payloads payloads(device);
  const MemoryRegion &junk_mr = payloads.junk_mr, &gradient_mr = payloads.gradient_mr;

  const sidecar::Grant mine = grant();
  ASSERT_EQ(mine.sequence, 1u);
  forger.send(ps::encode(ps::Claim{mine.sequence, mine.token ^ 1}));
  EXPECT_TRUE(dropped(forger)) << "a claim with a forged token";
  const ps::Opened window = claim(victim, mine.sequence, mine.token);
  ASSERT_EQ(window.sequence, mine.sequence);
  ASSERT_NE(window.window_rkey, 0u);
  EXPECT_NE(window.window_rkey, slots.rkey);
  replayer.send(ps::encode(ps::Claim{mine.sequence, mine.token}));
  EXPECT_TRUE(dropped(replayer)) << "a second claim of a claimed sequence, with its right token";
  // A doorbell alone needs no key (a zero-length write): before the victim wrote, it would have
  // the server apply an empty slot. Refused from anyone but the claimant.
  bell_rogue.wait(bell_rogue.write_with_imm(junk_mr, 0, slots, 0, 0, static_cast<std::uint32_t>(mine.sequence)), 30s);
  std::this_thread::sleep_for(300ms);
  const RegionDescriptor my_slot{slots.addr + (mine.sequence % 8) * kBytes, kBytes, window.window_rkey};
  EXPECT_EQ(refusal_of(victim, victim.write(gradient_mr, 0, my_slot, 0, kBytes, Signal::always)), "landed")
      << "the rogue's doorbell closed the victim's slot";

  EXPECT_EQ(refusal_of(ring_key_rogue,
                       ring_key_rogue.write(junk_mr, 0, slots, (mine.sequence % 8) * kBytes, kBytes, Signal::always)),
            "remote_access");
  const sidecar::Grant theirs = grant();
  ASSERT_EQ(theirs.sequence, 2u);
  EXPECT_NE(theirs.token, mine.token);
  const ps::Opened their_window = claim(other_grant_rogue, theirs.sequence, theirs.token);
  ASSERT_NE(their_window.window_rkey, 0u);
  EXPECT_EQ(refusal_of(other_grant_rogue,
                       other_grant_rogue.write(junk_mr, 0, {my_slot.addr, kBytes, their_window.window_rkey}, 0, kBytes,
                                               Signal::always)),
            "remote_access");
  victim.wait(victim.write_with_imm(gradient_mr, 0, my_slot, 0, 0, static_cast<std::uint32_t>(mine.sequence)), 30s);
  std::this_thread::sleep_for(300ms);  // the server takes the doorbell and closes the window
  EXPECT_EQ(refusal_of(victim, victim.write(junk_mr, 0, my_slot, 0, kBytes, Signal::always)), "remote_access")
      << "the key of a claim whose update arrived must be dead";
  apps.complete(mine.request, mine.part_index, 1us);
  apps.complete(theirs.request, theirs.part_index, 0us, /*failed=*/true);

  for (Connection* c : {&victim, &forger, &replayer, &ring_key_rogue, &other_grant_rogue, &bell_rogue}) {
    Connection leave = std::move(*c);
  }
  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(stats["claimed"].get<std::uint64_t>(), 2u) << "the victim's and the other grant's";
  EXPECT_EQ(stats["refused_claims"].get<std::uint64_t>(), 2u) << "the forged one and the replayed one";
  EXPECT_EQ(stats["refused_doorbells"].get<std::uint64_t>(), 1u) << "the rogue's doorbell";
  expect_moved_by_one_update(out, "a refused write or doorbell changed the model");
}

TEST_F(RogueWorkers, WithGrantWindowsAReplicasMirrorSlotOpensOnlyToItsClaimant) {
  // The replica's ring, written by the workers' mirrors, is opened by no key either: a worker
  // claims its mirror's slot with the token its server's grant carried (the replica learned
  // the server's key on connect). The victim (worker 1) is granted sequence 1; before it
  // mirrors, a rogue rings the replica's doorbell for it and writes the slot with the ring's
  // key, and another claims it with a forged token. Each is refused; the victim's mirror and
  // update land, its key at the replica dies with its doorbell, and the replica ends bitwise
  // equal to the server, moved by exactly the victim's update.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = fresh_out("rogue-replica-windows");
  const std::vector<std::string> shard = {
      "floats=" + std::to_string(kFloats), "slots=8", "workers=3", "updates=1", "out=" + out, "grant_windows=1"};
  auto node = [&](std::vector<std::string> head) {
    head.insert(head.begin(), GRADLANE_PS_NODE);
    head.insert(head.end(), shard.begin(), shard.end());
    return head;
  };
  ExternalProcess replica(node({"role=replica", "device=" + hosts[1].device, "port=7815"}), out + "/replica");
  ExternalProcess server(
      node({"role=server", "device=" + hosts[0].device, "port=7814", "replica=" + hosts[1].address + ":7815"}),
      out + "/server");
  Device device = Device::open({.name = hosts[2].device});
  auto at_server = [&](std::uint32_t id) { return RogueWorkers::join(device, hosts[0].address, 7814, id); };
  auto at_replica = [&](std::uint32_t id) { return RogueWorkers::join(device, hosts[1].address, 7815, id); };
  auto [victim, slots] = at_server(1);
  auto [victim_mirror, mirror_ring] = at_replica(1);
  auto [rogue, ring1] = at_server(2);
  auto [rogue_mirror, ring2] = at_replica(2);
  auto [forger, ring3] = at_server(3);
  auto [forger_mirror, ring4] = at_replica(3);
  (void)ring1, (void)ring2, (void)ring3, (void)ring4;

  const Payloads payloads(device);
  const MemoryRegion &junk_mr = payloads.junk_mr, &gradient_mr = payloads.gradient_mr;

  victim.send(ps::encode(ps::Request{1, 0, 0}));
  const ps::Message answer = ps::decode(victim.receive(30s));
  ASSERT_TRUE(std::holds_alternative<ps::Grant>(answer));
  const ps::Grant mine = std::get<ps::Grant>(answer);
  ASSERT_EQ(mine.sequence, 1u);
  ASSERT_NE(mine.window_rkey, 0u);
  ASSERT_NE(mine.token, 0u) << "a windowed server's grant carries the token for the replica";
  const auto imm = static_cast<std::uint32_t>(mine.sequence);
  const std::uint64_t offset = (mine.sequence % 8) * kBytes;

  // Before the victim mirrors: a doorbell alone, a write with the ring's key, a forged claim.
  rogue_mirror.wait(rogue_mirror.write_with_imm(junk_mr, 0, mirror_ring, 0, 0, imm), 30s);
  EXPECT_EQ(refusal_of(rogue_mirror, rogue_mirror.write(junk_mr, 0, mirror_ring, offset, kBytes, Signal::always)),
            "remote_access");
  forger_mirror.send(ps::encode(ps::Claim{mine.sequence, mine.token ^ 1}));
  try {
    (void)forger_mirror.receive(10s);
    ADD_FAILURE() << "the replica answered a claim with a forged token";
  } catch (const Error& e) {
    std::printf("  [dropped] %s\n", e.what());
  }
  std::this_thread::sleep_for(300ms);

  // The victim claims its mirror's slot, mirrors, rings; then writes the server's slot.
  victim_mirror.send(ps::encode(ps::Claim{mine.sequence, mine.token}));
  const ps::Message opened = ps::decode(victim_mirror.receive(30s));
  ASSERT_TRUE(std::holds_alternative<ps::Opened>(opened));
  const std::uint32_t mirror_key = std::get<ps::Opened>(opened).window_rkey;
  ASSERT_NE(mirror_key, 0u);
  EXPECT_NE(mirror_key, mirror_ring.rkey);
  const RegionDescriptor my_mirror{mirror_ring.addr + offset, kBytes, mirror_key};
  victim_mirror.wait(victim_mirror.write_and_ring(gradient_mr, 0, my_mirror, 0, kBytes, imm), 30s);
  victim.wait(victim.write_and_ring(gradient_mr, 0, {slots.addr + offset, kBytes, mine.window_rkey}, 0, kBytes, imm),
              30s);
  std::this_thread::sleep_for(300ms);  // the replica takes the doorbell and closes the window
  EXPECT_EQ(refusal_of(victim_mirror, victim_mirror.write(junk_mr, 0, my_mirror, 0, kBytes, Signal::always)),
            "remote_access")
      << "the key of a mirror claim whose mirror arrived must be dead";
  victim.send(ps::encode(ps::Bye{1}));
  victim.flush(30s);

  for (Connection* c : {&victim, &victim_mirror, &rogue, &rogue_mirror, &forger, &forger_mirror}) {
    Connection leave = std::move(*c);
  }
  const json stats = finished_stats(server, out);
  EXPECT_EQ(stats["applied"].get<std::uint64_t>(), 1u);
  const auto replica_status = replica.wait_exit(60s);
  ASSERT_TRUE(replica_status.has_value()) << "the replica did not finish";
  std::ifstream replica_file(out + "/replica.stats.json");
  const json replica_stats = json::parse(replica_file);
  EXPECT_EQ(replica_stats["applied"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(replica_stats["claimed"].get<std::uint64_t>(), 1u) << "the victim's";
  EXPECT_EQ(replica_stats["refused_claims"].get<std::uint64_t>(), 1u) << "the forged one";
  EXPECT_EQ(replica_stats["refused_doorbells"].get<std::uint64_t>(), 1u) << "the rogue's doorbell";
  EXPECT_EQ(replica_stats["mirrors_fetched"].get<std::uint64_t>(), 0u) << "the victim's mirror was the one applied";
  expect_moved_by_one_update(out, "a refused write or doorbell changed the server's model");
  const auto server_model = read_model(out + "/server.model", kFloats),
             replica_model = read_model(out + "/replica.model", kFloats);
  EXPECT_EQ(std::memcmp(server_model.data(), replica_model.data(), kBytes), 0)
      << "a refused write or doorbell changed the replica's model";
}

}  // namespace
}  // namespace gradlane::testing

namespace gradlane::testing {
namespace {

TEST(ReadmeExample, PsQuickstartRunsAsServerReplicaAndWorker) {
  // The parameter-server example (docs/parameter-server.md, examples/ps_quickstart.cpp), as
  // three processes on three emulated hosts.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = std::string(std::getenv("GRADLANE_OUT_DIR")) + "/quickstart";
  std::filesystem::create_directories(out);
  const std::string bin = GRADLANE_PS_QUICKSTART;
  ExternalProcess replica({bin, "replica", hosts[1].device}, out + "/replica");
  ExternalProcess server({bin, "server", hosts[0].device, hosts[1].address}, out + "/server");
  ExternalProcess worker({bin, "worker", hosts[2].device, hosts[0].address, hosts[1].address}, out + "/worker");
  for (auto* p : {&worker, &server, &replica}) {
    const auto status = p->wait_exit(120s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "status " << *status;
  }
  std::ifstream in(out + "/replica.out");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "replica: version 20, model[0] = 0.50");  // 1.0 - 20 × 0.05 × 0.5
}

}  // namespace
}  // namespace gradlane::testing

namespace gradlane::testing {
namespace {

TEST(Sharding, AModelSpreadOverTwoServersIsAppliedShardByShard) {
  // Tensors 3000, 1000, 2000, 500 floats over two servers (place_tensors: 3000 | 1000+2000+500);
  // three workers push every shard each step, each shard server keeps its own sequence.
  const auto hosts = hosts_from_env();
  ASSERT_GE(hosts.size(), 3u);
  const std::string out = std::string(std::getenv("GRADLANE_OUT_DIR")) + "/sharded";
  std::filesystem::remove_all(out);
  const std::string node = GRADLANE_PS_NODE, tensors = "tensors=3000,1000,2000,500";
  constexpr std::uint64_t kWorkers = 3, kUpdates = 20;
  std::vector<std::unique_ptr<ExternalProcess>> servers;
  for (int s = 0; s < 2; ++s) {
    const std::string dir = out + "/shard" + std::to_string(s);
    std::filesystem::create_directories(dir);
    servers.push_back(std::make_unique<ExternalProcess>(
        std::vector<std::string>{node, "role=server", "device=" + hosts[s].device, "port=" + std::to_string(7820 + s),
                                 tensors, "shards=2", "shard=" + std::to_string(s), "workers=3",
                                 "updates=" + std::to_string(kUpdates), "out=" + dir},
        dir + "/server"));
  }
  const std::string at = "servers=" + hosts[0].address + ":7820," + hosts[1].address + ":7821";
  std::vector<std::unique_ptr<ExternalProcess>> workers;
  for (std::uint64_t id = 1; id <= kWorkers; ++id) {
    workers.push_back(std::make_unique<ExternalProcess>(
        std::vector<std::string>{node, "role=worker", "device=" + hosts[2].device, "id=" + std::to_string(id), at,
                                 tensors, "updates=" + std::to_string(kUpdates), "out=" + out},
        out + "/worker" + std::to_string(id)));
  }
  for (auto& p : workers) {
    const auto status = p->wait_exit(240s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "worker status " << *status;
  }
  // 3000 -> server 0; 2000, then 1000 -> server 1; 500 -> the tie goes to server 0.
  const std::vector<std::size_t> sizes = {3000, 1000, 2000, 500};
  const auto shard_floats = ps::shard_floats(ps::place_tensors(sizes, 2), 2);
  ASSERT_EQ(shard_floats, (std::vector<std::size_t>{3500, 3000}));
  for (int s = 0; s < 2; ++s) {
    const auto status = servers[s]->wait_exit(60s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "server " << s;
    const std::string dir = out + "/shard" + std::to_string(s);
    const auto history = read_lines(dir + "/server.jsonl");
    ASSERT_EQ(history.size(), kWorkers * kUpdates) << "shard " << s;
    std::vector<float> reference(shard_floats[s], examples::initial_value(0)), gradient(shard_floats[s]);
    for (const auto& u : history) {
      for (std::size_t j = 0; j < gradient.size(); ++j) {
        gradient[j] =
            examples::gradient_value(u["worker"].get<std::uint64_t>(), u["tag"].get<std::uint64_t>(), j, false);
      }
      ps::sgd_step(reference, gradient, examples::kLearningRate);
    }
    const auto model = read_model(dir + "/server.model", shard_floats[s]);  // throws if the size differs
    EXPECT_EQ(std::memcmp(model.data(), reference.data(), model.size() * sizeof(float)), 0) << "shard " << s;
  }
}

}  // namespace
}  // namespace gradlane::testing
