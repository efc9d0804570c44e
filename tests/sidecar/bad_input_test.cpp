// Malformed entries and a corrupted queue: the sender gets an error (or is evicted), the
// daemon keeps going, and the other apps see nothing of it.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <thread>
#include <tuple>
#include <vector>

#include "harness.hpp"
#include "sidecar/client/internals.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

shm::AppEntry raw_submit(std::uint64_t request, std::uint32_t job) {
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::submit;
  e.job = job;
  e.request = request;
  e.body.submit = {.tensor = 1,
                   .receiver = 9,
                   .bytes = 4096,
                   .region_offset = 0,
                   .computed_on = 0,
                   .gradient_norm = 1.0F,
                   .priority = 0,
                   .job_remaining = 0};
  return e;
}

TEST(SidecarBadInput, MalformedEntriesAreAnsweredToTheSenderOnly) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  Client bad = Client::attach(test_attach(name, 1));
  Client good = Client::attach(test_attach(name, 2));

  struct Case {
    const char* what;
    shm::AppEntry entry;
    Reason reason;
  };
  std::vector<Case> cases;
  std::uint64_t id = 1000;
  auto add = [&](const char* what, Reason reason, auto mutate) {
    shm::AppEntry e = raw_submit(id++, 1);
    mutate(e);
    cases.push_back({what, e, reason});
  };
  add("unknown job", Reason::unknown_job, [](shm::AppEntry& e) { e.job = 77; });
  add("zero bytes", Reason::bad_size, [](shm::AppEntry& e) { e.body.submit.bytes = 0; });
  add("absurd bytes", Reason::bad_size, [](shm::AppEntry& e) { e.body.submit.bytes = ~std::uint64_t{0}; });
  add("offset outside region", Reason::bad_offset, [](shm::AppEntry& e) { e.body.submit.region_offset = 2 << 20; });
  add("offset overflows", Reason::bad_offset,
      [](shm::AppEntry& e) { e.body.submit.region_offset = ~std::uint64_t{0} - 100; });
  add("future entry format", Reason::bad_format, [](shm::AppEntry& e) { e.format = 0x7777; });
  add("unknown operation", Reason::bad_format, [](shm::AppEntry& e) { e.op = static_cast<shm::Op>(42); });
  add("unknown flags", Reason::unknown_fields, [](shm::AppEntry& e) { e.flags = 0x80; });
  add("NaN gradient norm", Reason::bad_value,
      [](shm::AppEntry& e) { e.body.submit.gradient_norm = std::numeric_limits<float>::quiet_NaN(); });
  add("send to itself", Reason::bad_receiver, [](shm::AppEntry& e) { e.body.submit.receiver = 1; });

  for (std::size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(ClientInternals::push_raw(bad, cases[i].entry), shm::RingStatus::ok);
    if (i == cases.size() / 2) good.request(small_update());  // interleaved with the garbage
  }
  const std::uint64_t fine = bad.request(small_update());  // the bad app still works afterwards

  for (const Case& c : cases) {
    const Grant g = bad.wait(2s);
    EXPECT_EQ(g.kind, GrantKind::error) << c.what;
    EXPECT_EQ(g.request, c.entry.request) << c.what;
    EXPECT_EQ(g.reason, c.reason) << c.what << ": got " << reason_name(g.reason);
  }
  const Grant ok = bad.wait(2s);
  EXPECT_EQ(ok.kind, GrantKind::go);
  EXPECT_EQ(ok.request, fine);

  const Grant other = good.wait(2s);
  EXPECT_EQ(other.kind, GrantKind::go);
  EXPECT_FALSE(good.poll().has_value()) << "the other app received someone else's errors";

  auto hold = driver.hold();
  EXPECT_EQ(driver.daemon().stats().errors, cases.size());
  EXPECT_EQ(driver.daemon().attached_apps(), 2U);
}

TEST(SidecarBadInput, BookkeepingErrors) {
  const std::string name = unique_shm_name();
  DaemonConfig config = test_config(name);
  config.max_outstanding = 3;
  DaemonDriver driver(config);
  Client app = Client::attach(test_attach(name, 1));

  // A completion for something never granted.
  app.complete(999, 0, 1us);
  Grant g = app.wait(2s);
  EXPECT_EQ(g.kind, GrantKind::error);
  EXPECT_EQ(g.reason, Reason::unknown_request);
  EXPECT_EQ(g.target, 2U) << "the error must say it refused a completion";

  // The same id twice while the first is still owed a completion. (Answers to different
  // entries are not ordered: a refusal is immediate, a grant waits for the policy.)
  ASSERT_EQ(ClientInternals::push_raw(app, raw_submit(500, 1)), shm::RingStatus::ok);
  ASSERT_EQ(ClientInternals::push_raw(app, raw_submit(500, 1)), shm::RingStatus::ok);
  const Grant first = app.wait(2s);
  const Grant second = app.wait(2s);
  EXPECT_EQ(first.request, 500U);
  EXPECT_EQ(second.request, 500U);
  const bool go_then_error = first.kind == GrantKind::go && second.reason == Reason::duplicate_request;
  const bool error_then_go = second.kind == GrantKind::go && first.reason == Reason::duplicate_request;
  EXPECT_TRUE(go_then_error || error_then_go) << kind_name(first.kind) << "/" << reason_name(first.reason) << ", "
                                              << kind_name(second.kind) << "/" << reason_name(second.reason);

  // Past --max-outstanding (500 is still open: granted, not completed).
  app.request(small_update());
  app.request(small_update());
  app.request(small_update());
  int go = 0;
  int refused = 0;
  for (int i = 0; i < 3; ++i) {
    g = app.wait(2s);
    go += g.kind == GrantKind::go ? 1 : 0;
    refused += g.kind == GrantKind::error && g.reason == Reason::too_many_outstanding ? 1 : 0;
  }
  EXPECT_EQ(go, 2);
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(app.outstanding(), 0U) << "an error answers the request: the client owes nothing";

  // Completing frees room again.
  app.complete(500, 0, 1us);
  app.request(small_update());
  EXPECT_EQ(app.wait(2s).kind, GrantKind::go);
}

// --max-owed-bytes: what an app may have requested and not settled, in bytes. The request
// that would pass it is refused; the others, and the same request once room is made, are taken.
TEST(SidecarBadInput, PastItsOwedBytesAnAppIsRefusedUntilItCompletes) {
  const std::string name = unique_shm_name();
  DaemonConfig config = test_config(name);
  config.max_update_bytes = 8192;
  config.max_owed_bytes = 3 * 4096 + 100;  // three small updates fit, a fourth does not
  DaemonDriver driver(config);
  Client app = Client::attach(test_attach(name, 1));
  std::vector<std::uint64_t> granted;
  for (int i = 0; i < 3; ++i) {
    app.request(small_update());
    const Grant g = app.wait(2s);
    ASSERT_EQ(g.kind, GrantKind::go) << reason_name(g.reason);
    granted.push_back(g.request);
  }
  app.request(small_update());
  Grant g = app.wait(2s);
  EXPECT_EQ(g.kind, GrantKind::error);
  EXPECT_EQ(g.reason, Reason::too_many_outstanding);
  // A smaller one still fits in what is left (100 bytes).
  Update tiny = small_update();
  tiny.bytes = 64;
  app.request(tiny);
  g = app.wait(2s);
  EXPECT_EQ(g.kind, GrantKind::go) << reason_name(g.reason);
  // Completing one frees its 4,096 bytes.
  app.complete(granted.front(), 0, 1us);
  app.request(small_update());
  g = app.wait(2s);
  EXPECT_EQ(g.kind, GrantKind::go) << reason_name(g.reason);
}

// A daemon that takes one small update at a time from an app, held for the test to step it;
// an app that will ask past that bound (greedy) and another on a NIC of its own (polite).
class GreedyAndPolite {
 public:
  explicit GreedyAndPolite(std::chrono::nanoseconds over_bound_every)
      : driver_(config(name_, over_bound_every)),
        greedy_(Client::attach(test_attach(name_, 1))),
        polite_(Client::attach(polite_options(name_))),
        hold_(driver_.hold()) {}
  std::tuple<DaemonDriver&, Client&, Client&> parts() { return {driver_, greedy_, polite_}; }

 private:
  static DaemonConfig config(const std::string& name, std::chrono::nanoseconds over_bound_every) {
    DaemonConfig c = test_config(name);
    c.max_update_bytes = 4096;
    c.max_owed_bytes = 4096;
    c.over_bound_every = over_bound_every;
    return c;
  }
  static AttachOptions polite_options(const std::string& name) {
    AttachOptions o = test_attach(name, 2);
    o.endpoint = 3;
    return o;
  }
  const std::string name_ = unique_shm_name();
  DaemonDriver driver_;
  Client greedy_;
  Client polite_;
  std::unique_lock<std::mutex> hold_;
};

// An app that keeps asking past its bound costs the others one entry per loop pass: refused
// once, it is read one entry a pass (another app's ten entries are all taken in one) until
// something it owes is settled. (With over_bound_every 0; the next test spaces those reads.)
TEST(SidecarBadInput, AnAppRefusedPastItsBoundIsReadOneEntryAPassUntilItSettles) {
  GreedyAndPolite apps(std::chrono::nanoseconds::zero());
  auto [driver, greedy, polite] = apps.parts();  // references to its members
  for (int i = 0; i < 11; ++i) greedy.request(small_update());
  Update tiny = small_update();
  tiny.bytes = 64;
  for (int i = 0; i < 10; ++i) polite.request(tiny);
  struct Answers {
    int refused = 0;
    std::vector<std::uint64_t> granted;
  };
  const auto answers = [](Client& app, Answers& a) {
    while (auto g = app.poll()) {
      if (g->kind == GrantKind::go) a.granted.push_back(g->request);
      if (g->kind == GrantKind::error && g->reason == Reason::too_many_outstanding) ++a.refused;
    }
  };
  Answers greedy_got, polite_got;
  driver.step();
  answers(greedy, greedy_got);
  answers(polite, polite_got);
  EXPECT_EQ(greedy_got.refused, 1) << "past its bound, the rest waits for later passes";
  EXPECT_EQ(polite_got.granted.size(), 10U) << "the other app's entries are all taken in the same pass";
  // The completion it sends now waits behind its own backlog: one refusal per pass.
  ASSERT_EQ(greedy_got.granted.size(), 1U);
  greedy.complete(greedy_got.granted.front(), 0, 1us);
  for (int pass = 2; pass <= 10; ++pass) {
    driver.step();
    answers(greedy, greedy_got);
    EXPECT_EQ(greedy_got.refused, pass) << "one entry per pass";
  }
  // The completion settles what it owed and lifts the limit: one pass takes two requests again,
  // the first granted, the second refused (its bound once more).
  driver.step();
  greedy.request(small_update());
  greedy.request(small_update());
  driver.step();
  answers(greedy, greedy_got);
  EXPECT_EQ(greedy_got.granted.size(), 2U);
  EXPECT_EQ(greedy_got.refused, 11);
}

// Past its bound, an app is read one entry per over_bound_every, not per pass: the passes in
// between take nothing of it (a loop kept busy by it would take a core from the other jobs'
// apps), while another app's entries are all taken in each.
TEST(SidecarBadInput, AnAppRefusedPastItsBoundIsReadOnceAnIntervalWhileTheOthersAreServed) {
  GreedyAndPolite apps(300ms);
  auto [driver, greedy, polite] = apps.parts();  // references to its members
  for (int i = 0; i < 5; ++i) greedy.request(small_update());
  Update tiny = small_update();
  tiny.bytes = 64;
  const auto refusals = [](Client& app) {
    int n = 0;
    while (auto g = app.poll()) n += g->kind == GrantKind::error && g->reason == Reason::too_many_outstanding ? 1 : 0;
    return n;
  };
  const auto granted = [](Client& app) {
    int n = 0;
    while (auto g = app.poll()) n += g->kind == GrantKind::go ? 1 : 0;
    return n;
  };
  // The passes within the interval are stepped at given instants, so a loaded machine cannot
  // stretch them past it.
  const sched::Instant first_pass = Daemon::clock_now();
  driver.daemon().step(first_pass);
  EXPECT_EQ(refusals(greedy), 1) << "its first request granted, the second refused";
  int refused = 0;
  for (int pass = 1; pass <= 5; ++pass) {
    for (int i = 0; i < 4; ++i) polite.request(tiny);
    driver.daemon().step(first_pass + std::chrono::milliseconds(pass));
    refused += refusals(greedy);
    EXPECT_EQ(granted(polite), 4) << "pass " << pass;
  }
  EXPECT_EQ(refused, 0) << "read again within the interval";
  EXPECT_EQ(driver.daemon().step(first_pass + 299ms), 0U) << "nothing to do: the loop may sleep";
  std::this_thread::sleep_for(310ms);
  driver.step();
  EXPECT_EQ(refusals(greedy), 1) << "one entry once the interval has passed";
}

TEST(SidecarBadInput, CorruptedQueueEvictsThatAppOnly) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name));
  Client bad = Client::attach(test_attach(name, 1));
  Client good = Client::attach(test_attach(name, 2));

  // Scribble over the request queue's write index, as a buggy app might.
  shm::AppSlot& slot = ClientInternals::slot(bad);
  slot.requests.tail.store(1'000'000'007, std::memory_order_release);
  shm::ring_bell(ClientInternals::header(bad).daemon_sleeping, ClientInternals::header(bad).doorbell);

  const auto deadline = std::chrono::steady_clock::now() + 2s;
  for (;;) {
    try {
      bad.poll();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::protocol);
      EXPECT_NE(std::string(e.what()).find("evicted"), std::string::npos) << e.what();
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the daemon did not notice the corrupt queue";
    std::this_thread::sleep_for(1ms);
  }
  good.request(small_update());
  EXPECT_EQ(good.wait(2s).kind, GrantKind::go);

  bad.detach();  // an evicted app detaches; its slot comes back
  Client again = Client::attach(test_attach(name, 1));
  again.request(small_update());
  EXPECT_EQ(again.wait(2s).kind, GrantKind::go);
  auto hold = driver.hold();
  EXPECT_EQ(driver.daemon().stats().evicted, 1U);
}

}  // namespace
}  // namespace gradlane::sidecar::test
