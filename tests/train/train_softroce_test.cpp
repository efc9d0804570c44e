// gradlane_train over real rxe (`ci/softroce.sh --hosts 3`): a short training job — server on
// host 0, replica on host 1, a worker on each of hosts 1 and 2, each a separate process — in
// fifo mode (direct), in gradlane mode (two gradlaneds), in aggregate mode (an aggregator on
// host 2 sums pairs of gradients and forwards each sum) and in gradlane mode with an aggregator
// (three workers, the server's ingress shaped to 4 Mbit/s so updates queue for it, and
// gradlaned redirects groups of them to the aggregator). Checked after each run:
//   - the server's model and the replica's are bitwise equal;
//   - the server's model is bitwise what replaying the run gives: every applied gradient
//     recomputed here from its worker's data order on the model version it was computed on,
//     applied in the server's sequence order with the server's kernel (aggregate mode: each
//     forwarded update the ordered sum of its members, in the aggregator's logged order; a
//     redirected push found by its aggregate id) — so
//     every byte that crossed the network (pull, push, forward) was the right one;
//   - accuracy on 1,000 test images rises from chance (~10 %) to above 60 %.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "../common/external_process.hpp"
#include "../common/hosts.hpp"
#include "../common/scrape.hpp"
#include "trainer/snapshots.hpp"
#include "train/dataset.hpp"
#include "train/model.hpp"
#include "ps/receiving/kernels.hpp"

namespace gradlane::testing {
namespace {

using namespace std::chrono_literals;
namespace tr = gradlane::train;

constexpr std::uint32_t kWorkers = 2;
constexpr std::uint64_t kSteps = 150;
constexpr float kLearningRate = 0.05F;
constexpr std::uint64_t kSeed = 7;
constexpr std::uint32_t kGroup = 2;  // aggregate mode: gradients per forwarded update

struct Push {
  std::uint64_t step = 0, computed_on = 0, sequence = 0, aggregate = 0;
  bool applied = false;
};

// worker<id>.pushes.csv: step,computed_on,sequence,aggregate,dropped,lost
std::vector<Push> read_pushes(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  std::vector<Push> pushes;
  while (std::getline(in, line)) {
    std::stringstream row(line);
    Push p;
    char comma = 0;
    int dropped = 0, lost = 0;
    row >> p.step >> comma >> p.computed_on >> comma >> p.sequence >> comma >> p.aggregate >> comma >> dropped >>
        comma >> lost;
    p.applied = dropped == 0 && lost == 0;
    pushes.push_back(p);
  }
  return pushes;
}

std::vector<float> read_floats(const std::string& path, std::size_t floats) {
  std::vector<float> v(floats);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(floats * sizeof(float)));
  EXPECT_EQ(std::filesystem::file_size(path), floats * sizeof(float)) << path;
  return v;
}

class TrainingRun : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& link : shaped_) {  // never leave a link narrow for the tests after this one
      ExternalProcess undo({"/bin/sh", "-c", "tc qdisc del dev " + link + " root"});
      (void)undo.wait_exit(20s);
    }
  }

  void shape(const std::string& link, const std::string& rate) {
    ExternalProcess shape(
        {"/bin/sh", "-c", "tc qdisc replace dev " + link + " root tbf rate " + rate + " burst 32kb latency 400ms"});
    ASSERT_EQ(shape.wait_exit(20s), std::optional<int>(0)) << "tc could not shape " << link;
    shaped_.push_back(link);
  }

  // mode: fifo | gradlane | aggregate; with_aggregator (gradlane): gradlaned seats an aggregator
  // on host 2 (endpoint 4) and is told the server's 4 Mbit/s ingress, to which h0-p is shaped.
  void run(const std::string& mode, bool with_aggregator = false) {
    const auto hosts = hosts_from_env();
    ASSERT_GE(hosts.size(), 3u) << "needs ci/softroce.sh --hosts 3";
    out_ = std::string(std::getenv("GRADLANE_OUT_DIR")) + "/train-" + mode + (with_aggregator ? "-aggregator" : "");
    std::filesystem::remove_all(out_);
    std::filesystem::create_directories(out_);
    const std::string train = GRADLANE_TRAIN, daemon = GRADLANE_GRADLANED;
    const std::vector<std::string> common = {"--mode",    mode,
                                             "--workers", std::to_string(workers_),
                                             "--lr",      std::to_string(kLearningRate),
                                             "--seed",    std::to_string(kSeed),
                                             "--out",     out_};
    const auto args = [&](std::vector<std::string> head, const std::vector<std::string>& tail) {
      head.insert(head.end(), common.begin(), common.end());  // after the role: they are its options
      head.insert(head.end(), tail.begin(), tail.end());
      return head;
    };
    if (with_aggregator) shape("h0-p", "4mbit");
    // Worker 1, alone on host 2 with two workers, pushes through a narrow link: a straggler.
    if (straggler_) shape("h2", "8mbit");  // out of host 2
    if (HasFatalFailure()) return;
    const auto metrics_at = [&](std::uint16_t port) -> std::vector<std::string> {
      if (!metrics_) return {};
      return {"--metrics", "127.0.0.1:" + std::to_string(port)};
    };
    // Worker `id` runs on host 2 (odd ids) or 1 and is scheduler endpoint 100 + id.
    const auto host_of = [](std::uint32_t id) { return id % 2 == 1 ? 2 : 1; };
    std::vector<std::unique_ptr<ExternalProcess>> sidecars;
    const bool gradlane = mode == "gradlane";
    if (gradlane) {
      std::vector<std::string> a = {daemon,
                                    "--foreground",
                                    "--shm-name",
                                    "/gradlane-train-test-a",
                                    "--device",
                                    hosts[0].device,
                                    "--endpoint",
                                    "0",
                                    "--listen-port",
                                    "7610",
                                    "--expect-peers",
                                    "1",
                                    "--staleness-bound",
                                    "8",
                                    "--replica-bound",
                                    "8"};
      std::vector<std::string> b = {daemon,
                                    "--foreground",
                                    "--shm-name",
                                    "/gradlane-train-test-b",
                                    "--device",
                                    hosts[1].device,
                                    "--listen-port",
                                    "7611",
                                    "--peer",
                                    hosts[0].address + ":7610",
                                    "--staleness-bound",
                                    "8",
                                    "--replica-bound",
                                    "8"};
      for (std::uint32_t id = 1; id <= workers_; ++id) {
        (host_of(id) == 1 ? b : a).insert((host_of(id) == 1 ? b : a).end(), {"--endpoint", std::to_string(100 + id)});
      }
      if (with_aggregator) {
        a.insert(a.end(),
                 {"--endpoint", "4", "--aggregator", "1:4", "--link-rate", "0:in:4mbit", "--aggregate-eagerly"});
      }
      for (const auto& flag : metrics_at(kDaemonMetricsPort)) a.push_back(flag);
      for (const auto& flag : metrics_at(kDaemonMetricsPort + 1)) b.push_back(flag);
      sidecars.push_back(std::make_unique<ExternalProcess>(a, out_ + "/gradlaned-a"));
      sidecars.push_back(std::make_unique<ExternalProcess>(b, out_ + "/gradlaned-b"));
    }
    const auto sidecar = [&](int host, std::uint32_t endpoint) -> std::vector<std::string> {
      if (!gradlane) return {};
      return {"--sidecar", host == 1 ? "/gradlane-train-test-b" : "/gradlane-train-test-a", "--endpoint",
              std::to_string(endpoint)};
    };
    const std::string replica_at = hosts[1].address + ":7821";
    const std::string aggregator_at = hosts[2].address + ":7822";
    const bool aggregate = mode == "aggregate";
    const std::string aggregator_id = std::to_string(workers_ + 1);
    // aggregate: the workers pull from the server but push to the aggregator (id workers + 1),
    // whose forwards are the only updates the server and the replica see. gradlane with an
    // aggregator: the workers push to the server, or to the aggregator when redirected.
    std::optional<ExternalProcess> aggregator;
    if (aggregate) {
      aggregator.emplace(
          args({train, "aggregator"}, {"--device", hosts[2].device, "--port", "7822", "--id", aggregator_id, "--server",
                                       hosts[0].address + ":7820", "--replica", replica_at, "--group",
                                       std::to_string(kGroup), "--metrics", "127.0.0.1:0"}),
          out_ + "/aggregator");
    } else if (with_aggregator) {
      auto tail = std::vector<std::string>{"--device",  hosts[2].device, "--port",   "7822",
                                           "--id",      aggregator_id,   "--server", hosts[0].address + ":7820",
                                           "--replica", replica_at};
      for (const auto& a : sidecar(2, 4)) tail.push_back(a);
      tail.insert(tail.end(), {"--metrics", "127.0.0.1:0"});  // its final metrics: aggregator.metrics.prom
      aggregator.emplace(args({train, "aggregator"}, tail), out_ + "/aggregator");
    }
    auto replica_tail = std::vector<std::string>{"--device", hosts[1].device, "--port", "7821"};
    for (const auto& flag : metrics_at(kServerMetricsPort + 1)) replica_tail.push_back(flag);
    if (aggregate) replica_tail.insert(replica_tail.end(), {"--peers", "1"});
    if (with_aggregator) replica_tail.insert(replica_tail.end(), {"--peers", aggregator_id});
    ExternalProcess replica(args({train, "replica"}, replica_tail), out_ + "/replica");
    auto server_tail = std::vector<std::string>{"--device", hosts[0].device, "--port", "7820",        "--replica",
                                                replica_at, "--snapshot-ms", "200",    "--live-eval", "0"};
    if (aggregator) server_tail.insert(server_tail.end(), {"--peers", aggregator_id});
    for (const auto& a : sidecar(0, 0)) server_tail.push_back(a);
    for (const auto& flag : metrics_at(kServerMetricsPort)) server_tail.push_back(flag);
    ExternalProcess server(args({train, "server"}, server_tail), out_ + "/server");
    // Scrapes the server while the job runs, as Prometheus would.
    std::atomic<bool> job_over{false};
    std::thread scraper;
    if (metrics_) {
      scraper = std::thread([&] {
        while (!job_over.load()) {
          try {
            const std::string text = test::scrape("127.0.0.1", kServerMetricsPort, 2000ms);
            if (const auto applied = test::sample_value(text, kServerApplied)) {
              ++scrapes_during_run_;
              applied_while_running_ = *applied;
            }
          } catch (const std::exception&) {
            // not listening yet, or gone
          }
          std::this_thread::sleep_for(250ms);
        }
      });
    }
    std::vector<std::unique_ptr<ExternalProcess>> workers;
    for (std::uint32_t id = 1; id <= workers_; ++id) {
      const int host = host_of(id);
      auto tail = std::vector<std::string>{"--device",
                                           hosts[static_cast<std::size_t>(host)].device,
                                           "--id",
                                           std::to_string(id),
                                           "--server",
                                           hosts[0].address + ":7820",
                                           "--steps",
                                           std::to_string(kSteps),
                                           "--server-endpoint",
                                           "0"};
      if (aggregate) {
        tail.insert(tail.end(), {"--aggregator", aggregator_at});
      } else {
        tail.insert(tail.end(), {"--replica", replica_at});
      }
      if (with_aggregator) tail.insert(tail.end(), {"--aggregator", aggregator_at, "--aggregator-endpoint", "4"});
      for (const auto& a : sidecar(host, 100 + id)) tail.push_back(a);
      if (metrics_) tail.insert(tail.end(), {"--metrics", "127.0.0.1:0"});
      workers.push_back(
          std::make_unique<ExternalProcess>(args({train, "worker"}, tail), out_ + "/worker" + std::to_string(id)));
    }
    for (auto& w : workers) EXPECT_EQ(w->wait_exit(600s), std::optional<int>(0)) << "see " << out_ << "/worker*.err";
    if (aggregator) {
      EXPECT_EQ(aggregator->wait_exit(120s), std::optional<int>(0)) << "see " << out_ << "/aggregator.err";
    }
    EXPECT_EQ(server.wait_exit(120s), std::optional<int>(0)) << "see " << out_ << "/server.out/.err";
    EXPECT_EQ(replica.wait_exit(120s), std::optional<int>(0)) << "see " << out_ << "/replica.out/.err";
    job_over = true;
    if (scraper.joinable()) scraper.join();
    // The daemons outlive the job: what they serve now is their account of all of it.
    for (std::uint16_t i = 0; metrics_ && gradlane && i < 2; ++i) {
      try {
        daemon_metrics_[i] = test::scrape("127.0.0.1", static_cast<std::uint16_t>(kDaemonMetricsPort + i));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "gradlaned " << (i == 0 ? 'a' : 'b') << ": " << e.what();
      }
    }
  }

  // The metrics of a gradlane-mode run with a straggler (worker 1): the roles' final metrics
  // are their stats, the daemons' decisions are the server's sequences, every push of each
  // worker was timed once, and the straggler tops the push time.
  void check_metrics() {
    const auto stats = nlohmann::json::parse(file("server.stats.json"));
    const std::string server = file("server.metrics.prom");
    const double applied = value(server, kServerApplied);
    EXPECT_EQ(applied, stats["applied"].get<double>());
    EXPECT_EQ(value(server, R"(gradlane_server_updates_total{outcome="skipped",role="server"})"),
              stats["skipped"].get<double>());
    EXPECT_EQ(value(server, R"(gradlane_server_version{role="server"})"), stats["version"].get<double>());
    const auto replica_stats = nlohmann::json::parse(file("replica.stats.json"));
    EXPECT_EQ(value(file("replica.metrics.prom"), R"(gradlane_server_updates_total{outcome="applied",role="replica"})"),
              replica_stats["applied"].get<double>());
    EXPECT_GT(scrapes_during_run_.load(), 0) << "the server's metrics were never scraped while it ran";
    EXPECT_LE(applied_while_running_.load(), applied);

    // gradlaned: the sender's daemon routes each decision once, so the two daemons' grants are
    // the server's sequences; each push settles once, at its sender's daemon.
    const double grants = value(daemon_metrics_[0], R"(gradlaned_decisions_total{kind="grant"})") +
                          value(daemon_metrics_[1], R"(gradlaned_decisions_total{kind="grant"})");
    EXPECT_EQ(grants, applied + stats["skipped"].get<double>());
    EXPECT_EQ(value(daemon_metrics_[0], R"(gradlaned_push_seconds_count{sender="101"})"), kSteps);
    EXPECT_EQ(value(daemon_metrics_[1], R"(gradlaned_push_seconds_count{sender="102"})"), kSteps);
    const double straggler = value(daemon_metrics_[0], R"(gradlaned_push_seconds_sum{sender="101"})");
    const double other = value(daemon_metrics_[1], R"(gradlaned_push_seconds_sum{sender="102"})");
    // Its writes crawl at 8 Mbit/s, but the other worker waits for the straggler's slots too:
    // about 2x in a first run, so 1.3x leaves room for a loaded machine.
    EXPECT_GT(straggler, 1.3 * other) << "worker 1's link is shaped to 8 Mbit/s: its pushes take longest";
    EXPECT_GT(value(file("worker1.metrics.prom"), R"(gradlane_worker_push_seconds_sum{worker="1"})"),
              1.3 * value(file("worker2.metrics.prom"), R"(gradlane_worker_push_seconds_sum{worker="2"})"));
    std::printf("metrics: %d scrapes during the run; push seconds straggler %.2f vs %.2f; grants %.0f = sequences\n",
                scrapes_during_run_.load(), straggler, other, grants);
  }

  // The aggregator's final metrics are its stats (members granted, summed and skipped; updates
  // forwarded, short and lost), and it forwarded sums: a run that aggregated nothing, or a
  // metric that counts another thing, fails.
  void check_aggregator_metrics() {
    const auto stats = nlohmann::json::parse(file("aggregator.stats.json"));
    const std::string text = file("aggregator.metrics.prom");
    for (const char* event : {"granted", "summed", "skipped"}) {
      EXPECT_EQ(value(text, std::string(R"(gradlane_aggregator_members_total{event=")") + event + "\"}"),
                stats[event].get<double>())
          << event;
    }
    for (const auto& [event, field] :
         {std::pair{"forwarded", "forwarded"}, std::pair{"short_group", "short_groups"}, std::pair{"lost", "lost"}}) {
      EXPECT_EQ(value(text, std::string(R"(gradlane_aggregator_forwards_total{event=")") + event + "\"}"),
                stats[field].get<double>())
          << event;
    }
    EXPECT_GT(stats["forwarded"].get<double>(), 0) << "the aggregator forwarded nothing";
    std::printf("aggregator metrics: %s members summed, %s updates forwarded\n", stats["summed"].dump().c_str(),
                stats["forwarded"].dump().c_str());
  }

  std::string file(const std::string& name) const {
    std::ifstream in(out_ + "/" + name);
    EXPECT_TRUE(in) << "no " << out_ << "/" << name;
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  static double value(const std::string& text, const std::string& sample) {
    const auto v = test::sample_value(text, sample);
    EXPECT_TRUE(v.has_value()) << "no " << sample << " in\n" << text;
    return v.value_or(-1);
  }

  // The server's applied log, in sequence order: (worker, sequence) of each applied update.
  std::vector<std::pair<std::uint32_t, std::uint64_t>> server_order() const {
    std::ifstream log(out_ + "/server.applied.csv");
    std::string line;
    std::getline(log, line);
    std::vector<std::pair<std::uint32_t, std::uint64_t>> order;
    while (std::getline(log, line)) {
      std::stringstream row(line);
      std::uint64_t sequence = 0, worker = 0, step = 0, computed_on = 0;
      int skipped = 0;
      char c = 0;
      row >> sequence >> c >> worker >> c >> step >> c >> computed_on >> c >> skipped;
      EXPECT_EQ(skipped, 0) << "no worker died, so no sequence may be a hole (sequence " << sequence << ")";
      order.emplace_back(static_cast<std::uint32_t>(worker), sequence);
    }
    return order;
  }

  // The run replayed here: versions[v] is the model after v updates; each worker's gradient at
  // a step is recomputed from its data order (seeded as gradlane_train seeds it).
  struct Replay {
    Replay(const tr::Model& m, const tr::FashionMnist& d, std::uint32_t workers) : model(m), data(d) {
      versions.emplace_back(model.parameters());
      model.initialise(versions[0], kSeed);
      // Every worker's batches, step by step (a dropped step used its batch too): a gradient
      // may be replayed after a later one of the same worker (an aggregate forwarded late).
      for (std::uint32_t id = 1; id <= workers; ++id) {
        tr::BatchSampler sampler(data.train.rows - 10000, 64, kSeed * 1000003ULL + id);
        for (std::uint64_t step = 0; step < kSteps; ++step) {
          const auto rows = sampler.next();
          batches[id].emplace_back(rows.begin(), rows.end());
        }
      }
    }
    // The gradient worker `worker` computed at `step` on version `computed_on`, into `out`.
    void gradient(std::uint32_t worker, std::uint64_t step, std::uint64_t computed_on, std::vector<float>& out) {
      ASSERT_LT(computed_on, versions.size()) << "computed on a version the server did not have yet";
      ASSERT_LT(step, kSteps);
      out.resize(model.parameters());
      model.gradient(versions[computed_on], data.train, batches.at(worker)[step], out, work);
    }
    void apply(std::span<const float> update) {
      auto next = versions.back();
      ps::sgd_step(next, update, kLearningRate);
      versions.push_back(std::move(next));
    }
    const tr::Model& model;
    const tr::FashionMnist& data;
    std::vector<std::vector<float>> versions;
    std::map<std::uint32_t, std::vector<std::vector<std::uint32_t>>> batches;  // [worker][step]
    tr::Workspace work;
  };

  // Server == replica == the replay, bitwise; the recorded model learned.
  void check_models(const tr::Model& model, const tr::FashionMnist& data, const Replay& replay, std::size_t gradients) {
    const auto server_model = read_floats(out_ + "/server.model", model.parameters());
    const auto replica_model = read_floats(out_ + "/replica.model", model.parameters());
    EXPECT_TRUE(server_model == replica_model) << "server and replica differ";
    EXPECT_TRUE(server_model == replay.versions.back()) << "the server's model is not the replay of the run";
    const auto snapshots = gradlane::trainer::read_snapshots(out_ + "/snapshots.bin");
    ASSERT_GE(snapshots.size(), 2u);
    const auto test = data.test.slice(0, 1000);
    const double first = model.accuracy(snapshots.front().model, test);
    const double last = model.accuracy(snapshots.back().model, test);
    EXPECT_LT(first, 0.2) << "the initial model guesses";
    EXPECT_GT(last, 0.6) << "after " << gradients << " gradients softmax regression is well above chance";
    EXPECT_TRUE(snapshots.back().model == server_model);
    std::printf("train %s: %zu gradients in %zu updates, accuracy %.3f -> %.3f on 1,000 test images\n", out_.c_str(),
                gradients, replay.versions.size() - 1, first, last);
  }

  // fifo and gradlane modes: every applied update is one worker's push.
  void check() {
    const tr::Model model(tr::ModelSpec{});
    const auto data = tr::load_fashion_mnist();
    const auto order = server_order();
    std::map<std::uint64_t, std::pair<std::uint32_t, Push>> by_sequence;
    std::size_t applied_pushes = 0;
    for (std::uint32_t id = 1; id <= workers_; ++id) {
      const auto pushes = read_pushes(out_ + "/worker" + std::to_string(id) + ".pushes.csv");
      ASSERT_EQ(pushes.size(), kSteps);
      for (const auto& p : pushes) {
        if (!p.applied) continue;
        ++applied_pushes;
        ASSERT_TRUE(by_sequence.emplace(p.sequence, std::make_pair(id, p)).second)
            << "sequence " << p.sequence << " twice";
      }
    }
    ASSERT_EQ(order.size(), applied_pushes) << "every applied push is in the server's log, once";
    ASSERT_GT(applied_pushes, workers_ * kSteps / 2) << "most gradients must reach the server";
    Replay replay(model, data, workers_);
    std::vector<float> gradient;
    for (const auto& [worker, sequence] : order) {
      const auto it = by_sequence.find(sequence);
      ASSERT_NE(it, by_sequence.end()) << "sequence " << sequence << " applied but no worker pushed it";
      ASSERT_EQ(it->second.first, worker);
      const Push& p = it->second.second;
      replay.gradient(worker, p.step, p.computed_on, gradient);
      if (HasFatalFailure()) return;
      replay.apply(gradient);
    }
    check_models(model, data, replay, order.size());
  }

  // aggregate mode: every applied update is the ordered sum of its members (the aggregator's
  // log, in sum order), each recomputed on the version it was computed on.
  void check_aggregated() {
    const tr::Model model(tr::ModelSpec{});
    const auto data = tr::load_fashion_mnist();
    struct Member {
      std::uint32_t worker = 0;
      std::uint64_t step = 0, computed_on = 0;
    };
    std::map<std::uint64_t, std::vector<Member>> members;  // by server sequence, in sum order
    std::ifstream in(out_ + "/aggregator.members.csv");
    std::string line;
    std::getline(in, line);
    std::size_t summed = 0;
    while (std::getline(in, line)) {
      std::stringstream row(line);
      std::uint64_t sequence = 0;
      Member m;
      char c = 0;
      row >> sequence >> c >> m.worker >> c >> m.step >> c >> m.computed_on;
      members[sequence].push_back(m);
      ++summed;
    }
    const auto order = server_order();
    EXPECT_EQ(summed, workers_ * kSteps) << "every gradient was summed into exactly one forwarded update";
    ASSERT_EQ(order.size(), members.size()) << "every forwarded update was applied, once";
    ASSERT_LT(order.size(), workers_ * kSteps * 3 / 4)
        << "pairs, mostly: the server saw far fewer updates than gradients";
    Replay replay(model, data, workers_);
    std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<float>> gradients;  // (worker, step)
    std::vector<float> sum(model.parameters());
    for (const auto& [worker, sequence] : order) {
      ASSERT_EQ(worker, workers_ + 1) << "only the aggregator pushes to the server";
      const auto it = members.find(sequence);
      ASSERT_NE(it, members.end()) << "sequence " << sequence << " applied but the aggregator did not forward it";
      std::vector<std::span<const float>> parts;
      for (const Member& m : it->second) {
        auto& g = gradients[{m.worker, m.step}];
        replay.gradient(m.worker, m.step, m.computed_on, g);
        if (HasFatalFailure()) return;
        parts.emplace_back(g);
      }
      ps::sum_in_order(sum, parts);
      replay.apply(sum);
    }
    check_models(model, data, replay, summed);
  }

  // gradlane mode with an aggregator: an applied update is one worker's push (a go grant) or
  // the aggregator's forward of redirected pushes, summed in its logged order and found at their
  // workers by the aggregate id.
  void check_sidecar_aggregation() {
    const tr::Model model(tr::ModelSpec{});
    const auto data = tr::load_fashion_mnist();
    std::map<std::uint64_t, std::pair<std::uint32_t, Push>> direct;      // by sequence
    std::map<std::pair<std::uint32_t, std::uint64_t>, Push> redirected;  // by (worker, aggregate)
    for (std::uint32_t id = 1; id <= workers_; ++id) {
      const auto pushes = read_pushes(out_ + "/worker" + std::to_string(id) + ".pushes.csv");
      ASSERT_EQ(pushes.size(), kSteps);
      for (const auto& p : pushes) {
        if (!p.applied) continue;
        const bool fresh = p.aggregate != 0 ? redirected.emplace(std::make_pair(id, p.aggregate), p).second
                                            : direct.emplace(p.sequence, std::make_pair(id, p)).second;
        ASSERT_TRUE(fresh) << "worker " << id << " step " << p.step << ": its sequence or aggregate twice";
      }
    }
    std::map<std::uint64_t, std::uint64_t> aggregate_of;  // server sequence -> aggregate id
    std::map<std::uint64_t, std::size_t> member_count;
    {
      std::ifstream in(out_ + "/aggregator.updates.csv");
      std::string line;
      std::getline(in, line);
      while (std::getline(in, line)) {
        std::stringstream row(line);
        std::uint64_t sequence = 0, group = 0, computed_on = 0, count = 0, lost = 0;
        char c = 0;
        row >> sequence >> c >> group >> c >> computed_on >> c >> count >> c >> lost;
        ASSERT_EQ(lost, 0u) << "no server died: no forward may be lost";
        aggregate_of[sequence] = group;
        member_count[sequence] = count;
      }
    }
    std::map<std::uint64_t, std::vector<std::uint32_t>> members;  // by server sequence, in sum order
    {
      std::ifstream in(out_ + "/aggregator.members.csv");
      std::string line;
      std::getline(in, line);
      while (std::getline(in, line)) {
        std::stringstream row(line);
        std::uint64_t sequence = 0, worker = 0;
        char c = 0;
        row >> sequence >> c >> worker;
        members[sequence].push_back(static_cast<std::uint32_t>(worker));
      }
    }
    const auto order = server_order();
    Replay replay(model, data, workers_);
    std::vector<float> gradient, sum(model.parameters());
    std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<float>> member_gradients;
    std::size_t gradients = 0, aggregates = 0;
    for (const auto& [worker, sequence] : order) {
      if (worker != workers_ + 1) {
        const auto it = direct.find(sequence);
        ASSERT_NE(it, direct.end()) << "sequence " << sequence << " applied but no worker pushed it";
        ASSERT_EQ(it->second.first, worker);
        replay.gradient(worker, it->second.second.step, it->second.second.computed_on, gradient);
        if (HasFatalFailure()) return;
        replay.apply(gradient);
        ++gradients;
        continue;
      }
      const auto group = aggregate_of.find(sequence);
      ASSERT_NE(group, aggregate_of.end()) << "sequence " << sequence << " applied from the aggregator, not in its log";
      const auto& names = members[sequence];
      ASSERT_EQ(names.size(), member_count[sequence]);
      ASSERT_GE(names.size(), 2u) << "the sidecar forms groups of two or more, and every member came";
      std::vector<std::span<const float>> parts;
      for (const std::uint32_t w : names) {
        const auto push = redirected.find({w, group->second});
        ASSERT_NE(push, redirected.end()) << "worker " << w << " has no push redirected to aggregate " << group->second;
        auto& g = member_gradients[{w, push->second.step}];
        replay.gradient(w, push->second.step, push->second.computed_on, g);
        if (HasFatalFailure()) return;
        parts.emplace_back(g);
      }
      ps::sum_in_order(sum, parts);
      replay.apply(sum);
      gradients += parts.size();
      ++aggregates;
    }
    EXPECT_EQ(gradients, direct.size() + redirected.size()) << "every applied push is in exactly one applied update";
    EXPECT_GT(aggregates, 0u) << "with the server's ingress at 4 Mbit/s, updates queue and gradlaned aggregates some";
    std::printf("train %s: %zu of %zu updates were aggregates of redirected pushes (%zu gradients)\n", out_.c_str(),
                aggregates, order.size(), redirected.size());
    check_models(model, data, replay, gradients);
  }

  static constexpr std::uint16_t kDaemonMetricsPort = 9461;  // gradlaned a, b
  static constexpr std::uint16_t kServerMetricsPort = 9463;  // server, replica
  static constexpr const char* kServerApplied = R"(gradlane_server_updates_total{outcome="applied",role="server"})";

  std::uint32_t workers_ = kWorkers;
  bool metrics_ = false;
  bool straggler_ = false;
  std::vector<std::string> shaped_;
  std::string out_;
  std::atomic<int> scrapes_during_run_{0};
  std::atomic<double> applied_while_running_{0};
  std::string daemon_metrics_[2];
};

TEST_F(TrainingRun, FifoTrainsAndTheModelIsTheReplayOfTheRun) {
  run("fifo");
  check();
}

// With a straggler and every role's metrics on: the model is still the replay of the run, and
// the metrics are the run's summary and name the straggler by its push time.
TEST_F(TrainingRun, GradlaneModeTrainsAndTheModelIsTheReplayOfTheRunAndItsMetricsNameTheStraggler) {
  metrics_ = true;
  straggler_ = true;
  run("gradlane");
  check();
  check_metrics();
}

TEST_F(TrainingRun, AggregateModeTrainsAndTheModelIsTheReplayOfTheSums) {
  run("aggregate");
  check_aggregated();
  check_aggregator_metrics();
}

TEST_F(TrainingRun, GradlaneModeAggregatesQueuedUpdatesAndTheModelIsTheReplayOfTheRun) {
  workers_ = 4;  // at a grant, the two workers neither granted nor computing wait: a pair
  run("gradlane", /*with_aggregator=*/true);
  check_sidecar_aggregation();
  check_aggregator_metrics();
}

}  // namespace
}  // namespace gradlane::testing
