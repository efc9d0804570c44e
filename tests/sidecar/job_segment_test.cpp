// A job given its own segment (gradlaned --job-user JOB:USER) is its user's alone: processes of
// another job's user can neither attach as it, nor get its queues to read them or to write a
// request or a grant into them; its own user cannot resize it under the daemon; the daemon
// serves a job only through its own segment; and an app takes a segment or a door only of its
// own user's or root's making.
//
// The kernel tells the door who knocks (SO_PEERCRED), so these tests need two users: they run
// as root and start each app as a child that drops to a job's uid.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/unique_fd.hpp"
#include "harness.hpp"
#include "sidecar/shm/door.hpp"
#include "sidecar/shm/futex.hpp"
#include "sidecar/shm/layout.hpp"
#include "sidecar/shm/process.hpp"
#include "sidecar/shm/segment.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

// Users no process of this host runs as: job 7's, job 8's, and one with no job segment.
constexpr std::uint32_t kJob7User = 61007, kJob8User = 61008, kStranger = 61009;

// The exit codes of the app-as-user child (harness.cpp).
constexpr int kAttachedAndGranted = 0, kMayNotMap = 20, kOwnSegment = 21, kKnockRefused = 22, kUntrusted = 23,
              kResizeRefused = 0;

int as_user(const std::string& shm, std::uint32_t uid, std::uint32_t job, const std::string& what,
            bool own_network = false) {
  Child child("app-as-user", {"--shm=" + shm, "--uid=" + std::to_string(uid), "--job=" + std::to_string(job),
                              "--try=" + what, std::string("--netns=") + (own_network ? "1" : "0")});
  const int status = child.wait_exit(10s);  // a wait status (or -1: still running)
  return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

DaemonConfig two_jobs_config(const std::string& shm) {
  DaemonConfig config = test_config(shm);
  config.job_segments = {{.job = 7, .uid = kJob7User}, {.job = 8, .uid = kJob8User}};
  return config;
}

#define REQUIRE_ROOT() \
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: it runs apps as two jobs' users (setuid); CI runs as root"

TEST(JobSegments, AJobsSegmentBelongsToItsUserAndAnotherJobsUserCannotAttachReadOrWriteIt) {
  REQUIRE_ROOT();
  const std::string shm = unique_shm_name();
  DaemonDriver driver(two_jobs_config(shm));

  for (const std::uint32_t job : {7U, 8U}) {
    struct stat st {};
    EXPECT_NE(::stat(("/dev/shm" + shm::job_segment_name(shm, job)).c_str(), &st), 0)
        << "job " << job << "'s segment has a name anyone could open or squat";
  }
  // Each job's user attaches as its job and is served.
  EXPECT_EQ(as_user(shm, kJob7User, 7, "attach"), kAttachedAndGranted);
  EXPECT_EQ(as_user(shm, kJob8User, 8, "attach"), kAttachedAndGranted);
  // Job 8's user, and a user of no job, cannot attach as job 7, nor get job 7's segment from
  // the door to read its queues or write into them (a forged request, a forged grant); and the
  // other way round.
  EXPECT_EQ(as_user(shm, kJob8User, 7, "attach"), kMayNotMap);
  EXPECT_EQ(as_user(shm, kJob8User, 7, "knock"), kKnockRefused);
  EXPECT_EQ(as_user(shm, kStranger, 7, "attach"), kMayNotMap);
  EXPECT_EQ(as_user(shm, kStranger, 7, "knock"), kKnockRefused);
  EXPECT_EQ(as_user(shm, kJob7User, 8, "attach"), kMayNotMap);
  EXPECT_EQ(as_user(shm, kJob7User, 8, "knock"), kKnockRefused);
  EXPECT_EQ(as_user(shm, kJob7User, 7, "knock"), 0) << "the job's own user is refused its segment";
  // And job 7 is still served after all of that.
  EXPECT_EQ(as_user(shm, kJob7User, 7, "attach"), kAttachedAndGranted);
  const DaemonStats stats = driver.stats();
  EXPECT_EQ(stats.attached, 3U);
  EXPECT_EQ(stats.rejected, 0U) << "every refusal above is the door's, before the daemon's loop sees anything";
}

TEST(JobSegments, AJobsOwnUserCannotResizeItsSegmentUnderTheDaemon) {
  REQUIRE_ROOT();
  // The segment is the job user's to map, read and write, but shrinking it would make the
  // daemon's next access past the new end a SIGBUS: every job's sidecar gone. Sealed, both
  // shrinking and growing are refused, and the daemon serves on.
  const std::string shm = unique_shm_name();
  DaemonDriver driver(two_jobs_config(shm));
  EXPECT_EQ(as_user(shm, kJob7User, 7, "resize"), kResizeRefused) << "job 7's user resized its segment";
  EXPECT_EQ(as_user(shm, kJob7User, 7, "attach"), kAttachedAndGranted);
  EXPECT_EQ(as_user(shm, kJob8User, 8, "attach"), kAttachedAndGranted);
  EXPECT_EQ(driver.stats().attached, 2U);
}

TEST(JobSegments, KnocksThatSayNothingDoNotHoldTheDoor) {
  REQUIRE_ROOT();
  // Anyone may connect to the door. Eight connections that never send a request must not keep
  // job 7's app (2 s to attach) from its segment: the door waits for no knock.
  const std::string shm = unique_shm_name();
  DaemonDriver driver(two_jobs_config(shm));
  const shm::DoorAddress door = shm::door_address(shm);
  std::vector<UniqueFd> silent;
  for (int i = 0; i < 8; ++i) {
    UniqueFd knock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(knock);
    ASSERT_EQ(::connect(knock.get(), reinterpret_cast<const sockaddr*>(&door.address), door.length), 0)
        << std::strerror(errno);
    silent.push_back(std::move(knock));
  }
  EXPECT_EQ(as_user(shm, kJob7User, 7, "attach"), kAttachedAndGranted);
  EXPECT_EQ(as_user(shm, kJob8User, 8, "attach"), kAttachedAndGranted);
}

TEST(JobSegments, AnAppInANetworkNamespaceOfItsOwnStillFindsTheDoor) {
  REQUIRE_ROOT();
  // An app in a container that shares the host's /dev/shm but not its network: the door is a
  // socket file beside the segment, so it is found there. (An abstract socket, as the door was,
  // belongs to a network namespace: the app found none, fell back to the shared segment and was
  // refused own_segment.)
  const std::string shm = unique_shm_name();
  DaemonDriver driver(two_jobs_config(shm));
  EXPECT_EQ(as_user(shm, kJob7User, 7, "attach", /*own_network=*/true), kAttachedAndGranted);
  EXPECT_EQ(as_user(shm, kJob8User, 7, "knock", /*own_network=*/true), kKnockRefused) << "another job's user";
}

TEST(JobSegments, AGradlanedThatDiedLeavesADoorTheNextOneTakes) {
  REQUIRE_ROOT();
  // SIGKILLed, a daemon leaves its socket file behind; the next one on that name removes it (a
  // socket of its user's nobody answers on) instead of refusing to start. One that stops
  // cleanly removes it itself.
  const std::string shm = unique_shm_name();
  const shm::DoorAddress door = shm::door_address(shm);
  {
    UniqueFd left(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(left);
    ASSERT_EQ(::bind(left.get(), reinterpret_cast<const sockaddr*>(&door.address), door.length), 0)
        << std::strerror(errno);
  }  // closed: the file stays, nobody listens
  ASSERT_EQ(::access(door.path(), F_OK), 0);
  {
    DaemonDriver driver(two_jobs_config(shm));
    EXPECT_EQ(as_user(shm, kJob7User, 7, "attach"), kAttachedAndGranted);
  }
  EXPECT_NE(::access(door.path(), F_OK), 0) << "a daemon that stopped left its door behind";
}

TEST(JobSegments, AnAppOnAJobsSegmentWakesASleepingDaemon) {
  REQUIRE_ROOT();
  // The daemon sleeps on every segment's doorbell at once (futex_waitv). Asleep for up to 30 s
  // here: an app of job 7 attaches (2 s bound) and is granted (5 s) only if ringing its own
  // segment's doorbell wakes it.
  const std::string shm = unique_shm_name();
  DaemonConfig config = two_jobs_config(shm);
  config.idle_spin = 0ms;
  config.idle_sleep = 30s;
  Daemon daemon(config, std::make_unique<sched::PassThroughPolicy>());
  std::atomic<bool> stop{false};
  std::thread loop([&] { daemon.run([&] { return stop.load(); }); });
  std::this_thread::sleep_for(100ms);  // asleep by now
  EXPECT_EQ(as_user(shm, kJob7User, 7, "attach"), kAttachedAndGranted);
  EXPECT_EQ(as_user(shm, kJob8User, 8, "attach"), kAttachedAndGranted);
  stop = true;
  auto shared = shm::Segment::open(shm);  // wake it to see `stop`
  ASSERT_TRUE(shared);
  shm::Header& h = *shm::header_at(shared->base());
  h.doorbell.fetch_add(1);
  shm::futex_wake(h.doorbell);
  loop.join();
  EXPECT_EQ(daemon.stats().attached, 2U);
}

// Claims slot 0 of `segment` by hand, as a process that can map it (root) but says it is of
// `job`, and returns what the daemon made of the claim: rejected (with the reason) or accepted.
std::string hand_attach(std::optional<shm::Segment> segment, std::uint32_t job) {
  if (!segment) return "no segment";
  shm::Header& h = *shm::header_at(segment->base());
  shm::AppSlot& slot = *shm::slot_at(segment->base(), 0);
  const auto pid = static_cast<std::uint32_t>(::getpid());
  std::uint64_t expected = shm::claim_word(shm::SlotState::free, 0);
  if (!slot.claim.compare_exchange_strong(expected, shm::claim_word(shm::SlotState::claiming, pid)))
    return "slot 0 taken";
  slot.owner_start_time = process_start_time(::getpid()).value_or(0);
  slot.job = job;
  slot.endpoint = 1;
  slot.region_bytes = 1 << 20;
  slot.take_over = 0;
  slot.slots = 0;
  slot.claim.store(shm::claim_word(shm::SlotState::attaching, pid), std::memory_order_release);
  h.attach_epoch.fetch_add(1, std::memory_order_acq_rel);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    const std::uint64_t word = slot.claim.load(std::memory_order_acquire);
    switch (shm::claim_state(word)) {
      case shm::SlotState::rejected:
        slot.claim.store(shm::claim_word(shm::SlotState::free, 0), std::memory_order_release);
        return std::string(reason_name(static_cast<Reason>(slot.reason.load())));
      case shm::SlotState::active:
        slot.claim.store(shm::claim_word(shm::SlotState::detaching, pid), std::memory_order_release);
        h.attach_epoch.fetch_add(1, std::memory_order_acq_rel);
        return "accepted";
      default:
        break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return "no answer";
    std::this_thread::sleep_for(1ms);
  }
}

// Job `job`'s own segment, from the door (root may have any).
std::optional<shm::Segment> job_segment(const std::string& shm, std::uint32_t job) {
  shm::DoorAnswer answer = shm::ask_door(shm, job, 2s);
  if (answer.kind != shm::DoorAnswer::Kind::granted) return std::nullopt;
  return shm::Segment::adopt(std::move(answer.segment), shm::job_segment_name(shm, job));
}

TEST(JobSegments, TheDaemonServesAJobOnlyThroughItsOwnSegment) {
  REQUIRE_ROOT();  // to map every segment by hand, whoever's job it is
  const std::string shm = unique_shm_name();
  DaemonDriver driver(two_jobs_config(shm));
  // Root (or the daemon's user) can map the shared segment; it still cannot be job 7 there.
  EXPECT_EQ(hand_attach(shm::Segment::open(shm), 7), "own_segment");
  EXPECT_EQ(hand_attach(job_segment(shm, 7), 8), "own_segment");
  EXPECT_EQ(hand_attach(job_segment(shm, 8), 1), "own_segment");
  EXPECT_EQ(hand_attach(job_segment(shm, 7), 7), "accepted");
  EXPECT_EQ(hand_attach(shm::Segment::open(shm), 1), "accepted")
      << "a job without a segment of its own shares the daemon's";
  EXPECT_EQ(driver.stats().rejected, 3U);
}

TEST(JobSegments, AnAppTakesASegmentOrADoorOnlyOfItsOwnUsersOrRootsMaking) {
  REQUIRE_ROOT();
  // Anyone can create a name in /dev/shm and bind an abstract socket. A segment or a door held
  // by another user, where gradlaned's would be, must not be taken: that user could answer the
  // app's requests with forged grants.
  const std::string shm = unique_shm_name();
  UniqueFd fd(::shm_open(shm.c_str(), O_RDWR | O_CREAT | O_EXCL, 0666));
  ASSERT_TRUE(fd) << std::strerror(errno);
  ASSERT_EQ(::fchown(fd.get(), kJob8User, kJob8User), 0);
  ASSERT_EQ(::fchmod(fd.get(), 0666), 0);
  ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(shm::segment_bytes(8))), 0);
  EXPECT_EQ(as_user(shm, kStranger, 5, "attach"), kUntrusted) << "took a squatted shared segment";
  ::shm_unlink(shm.c_str());

  const std::string door_shm = unique_shm_name();
  Child squatter("app-as-user",
                 {"--shm=" + door_shm, "--uid=" + std::to_string(kJob8User), "--job=5", "--try=squat-door"});
  ASSERT_TRUE(squatter.ready(10s));
  EXPECT_EQ(as_user(door_shm, kStranger, 5, "attach"), kUntrusted) << "asked a squatted door";
  // And gradlaned does not start behind it, saying why.
  try {
    DaemonConfig config = two_jobs_config(door_shm);
    Daemon daemon(config, std::make_unique<sched::PassThroughPolicy>());
    ADD_FAILURE() << "gradlaned started with its door held by another process";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is taken"), std::string::npos) << e.what();
  }
  ::unlink(shm::door_address(door_shm).path());  // the squatter's socket file
}

TEST(JobSegments, ABadJobUserIsRefusedNamingIt) {
  DaemonConfig twice = test_config(unique_shm_name());
  twice.job_segments = {{.job = 7, .uid = 1}, {.job = 7, .uid = 2}};
  try {
    twice.validate();
    ADD_FAILURE() << "job 7 given two users was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("job 7 twice"), std::string::npos) << e.what();
  }
  if (::geteuid() == 0) return;  // root may serve any user's job
  // Apps take a segment only from a door of root's or their own user's: a daemon of another
  // user would serve a job none of whose apps could attach.
  DaemonConfig other = test_config(unique_shm_name());
  other.job_segments = {{.job = 7, .uid = ::geteuid() + 1}};
  try {
    Daemon daemon(other, std::make_unique<sched::PassThroughPolicy>());
    ADD_FAILURE() << "a non-root daemon took another user's job";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs gradlaned to run as root"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradlane::sidecar::test
