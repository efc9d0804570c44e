// Load: 8 applications x 10,000 updates through ONE gradlaned running the
// real scheduling core. Each application is a thread with its own Client, so its own app slot
// and queues, exactly what a separate process gets (one process keeps the test cheap).
//
// Checked per application, by request id:
//   - every id request() returned gets exactly one final answer (go, drop or error), none twice,
//     none for an id it never handed out, none missing at the end;
//   - a full request queue is reported to the submitter (Error resource_exhausted, nothing
//     queued): each app submits in bursts without reading its answers, so its grant queue
//     backs up, the daemon stops taking its requests and its request queue fills — every app
//     must meet the full queue at least once, and lose nothing by it;
//   - completions are never refused (every go is completed once);
// and daemon-wide: the answers it published are the answers the apps read, and once all is
// completed the scheduler holds no credit (nothing leaked in flight).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "sidecar/core/policy.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kApps = 8;
constexpr std::uint64_t kUpdatesPerApp = 10'000;
// Requests an app has unanswered or granted-uncompleted at most: above what the queues hold
// (256 + 256 + the daemon's outbox), so every burst meets a full queue, and below the daemon's
// --max-outstanding (4096), so too_many_outstanding is not an expected answer.
constexpr std::uint64_t kWindow = 1024;

struct AppResult {
  std::map<std::uint64_t, int> answers;  // request id -> final answers seen (must end at 1 each)
  std::uint64_t submitted = 0;
  std::uint64_t full_queue = 0;  // request() refused with resource_exhausted
  std::uint64_t go = 0, drop = 0, error = 0;
  std::uint64_t completed = 0;
  std::vector<std::string> problems;  // anything that must not happen, in words
};

class LoadApp {
 public:
  LoadApp(const std::string& shm, std::uint32_t job) : client_(Client::attach(options(shm, job))) {}

  AppResult run() {
    Update update = small_update();
    while (result_.submitted < kUpdatesPerApp || client_.outstanding() > 0 || !to_complete_.empty()) {
      // A burst: as much as the queue takes, without reading answers.
      while (result_.submitted < kUpdatesPerApp && in_flight() < kWindow) {
        try {
          update.computed_on = pulled_;  // as if it pulled the model after each of its updates
          const std::uint64_t id = client_.request(update);
          ++result_.submitted;
          if (!result_.answers.emplace(id, 0).second) problem("request id " + std::to_string(id) + " handed out twice");
        } catch (const Error& e) {
          if (e.code() != Errc::resource_exhausted) throw;
          ++result_.full_queue;
          break;
        }
      }
      if (client_.outstanding() > 0) take(client_.wait(10s));
      while (auto g = client_.poll()) take(*g);
      complete_granted();
    }
    return std::move(result_);
  }

 private:
  static AttachOptions options(const std::string& shm, std::uint32_t job) {
    AttachOptions o = test_attach(shm, job);
    o.spin = 0us;  // eight apps on two cores: sleeping waiters leave the daemon its core
    return o;
  }

  std::uint64_t in_flight() const { return client_.outstanding() + to_complete_.size(); }

  void problem(std::string what) {
    if (result_.problems.size() < 10) result_.problems.push_back(std::move(what));
  }

  void take(const Grant& g) {
    if (g.kind == GrantKind::error && g.target != static_cast<std::uint32_t>(shm::Op::submit)) {
      problem("a completion was refused: " + std::string(reason_name(g.reason)));
      return;
    }
    const auto it = result_.answers.find(g.request);
    if (it == result_.answers.end()) {
      problem("an answer for request " + std::to_string(g.request) + ", which was never submitted");
      return;
    }
    if (g.part_count != 1 && g.kind != GrantKind::error) problem("a 4 KiB update was split");
    if (++it->second > 1) problem("request " + std::to_string(g.request) + " answered twice");
    switch (g.kind) {
      case GrantKind::go:
        ++result_.go;
        pulled_ = std::max(pulled_, g.sequence);
        to_complete_.push_back(g.request);
        break;
      case GrantKind::drop:
        ++result_.drop;
        break;
      case GrantKind::error:
        ++result_.error;
        break;
      default:
        problem("unexpected answer " + std::string(kind_name(g.kind)));
    }
  }

  // Completes every go. A full queue here means answers wait to be read (the daemon stops
  // taking requests while they back up): read them, then retry.
  void complete_granted() {
    for (std::size_t i = 0; i < to_complete_.size();) {
      try {
        client_.complete(to_complete_[i], 0, 1us);
        ++result_.completed;
        ++i;
      } catch (const Error& e) {
        if (e.code() != Errc::resource_exhausted) throw;
        ++result_.full_queue;
        while (auto g = client_.poll()) take(*g);
        std::this_thread::yield();
      }
    }
    to_complete_.clear();
  }

  Client client_;
  AppResult result_;
  std::vector<std::uint64_t> to_complete_;  // go answers not yet completed
  std::uint64_t pulled_ = 0;
};

TEST(SidecarLoad, EightAppsTenThousandUpdatesEachGetExactlyOneAnswerEach) {
  const std::string name = unique_shm_name();
  sched::SchedulerConfig sc;
  sc.replica_bound = std::nullopt;  // nothing acknowledges here
  // With up to 8 x 1024 requests in flight most would be stale at tau = 64 and dropped at once;
  // unbounded, every request goes through a grant, a slot, credit and a completion.
  sc.staleness_bound = std::nullopt;
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(sc));

  std::vector<AppResult> results(kApps);
  std::vector<std::string> failures(kApps);
  {
    std::vector<std::jthread> apps;
    for (std::uint32_t a = 0; a < kApps; ++a) {
      apps.emplace_back([&, a] {
        try {
          LoadApp app(name, /*job=*/a + 1);  // eight tenants sharing one NIC
          results[a] = app.run();
        } catch (const std::exception& e) {
          failures[a] = e.what();
        }
      });
    }
  }

  std::uint64_t answers = 0;
  for (std::uint32_t a = 0; a < kApps; ++a) {
    SCOPED_TRACE("app " + std::to_string(a + 1));
    const AppResult& r = results[a];
    EXPECT_EQ(failures[a], "");
    EXPECT_EQ(r.problems, std::vector<std::string>{});
    EXPECT_EQ(r.submitted, kUpdatesPerApp);
    EXPECT_EQ(r.answers.size(), kUpdatesPerApp);
    std::uint64_t unanswered = 0;
    for (const auto& [id, n] : r.answers) unanswered += n == 0 ? 1 : 0;
    EXPECT_EQ(unanswered, 0U) << "requests that got no answer";
    EXPECT_EQ(r.go + r.drop + r.error, kUpdatesPerApp);
    EXPECT_EQ(r.error, 0U) << "no request here is malformed or over --max-outstanding";
    EXPECT_EQ(r.completed, r.go);
    EXPECT_GT(r.go, 0U);
    EXPECT_GT(r.full_queue, 0U) << "the bursts never met a full queue: the test did not test it";
    answers += r.go + r.drop + r.error;
    std::printf("app %u: %llu go, %llu dropped (stale), %llu errors, full queue met %llu times\n", a + 1,
                static_cast<unsigned long long>(r.go), static_cast<unsigned long long>(r.drop),
                static_cast<unsigned long long>(r.error), static_cast<unsigned long long>(r.full_queue));
  }
  const DaemonStats stats = driver.stats();
  EXPECT_EQ(stats.answers, answers) << "the daemon published answers no app read, or the reverse";
  EXPECT_EQ(stats.submitted, kApps * kUpdatesPerApp);
  EXPECT_TRUE(driver.credit_returned(1, 5s)) << "credit still held after every go was completed";
}

}  // namespace
}  // namespace gradlane::sidecar::test
