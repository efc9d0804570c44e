// gradlaned as a service: readiness through sd_notify, one daemon per endpoint, SIGHUP
// reopening the schedule log, a schedule log that is a symbolic link refused, and a closed
// stderr that neither kills it nor stops it. Natively: no peers, so no RDMA device.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../common/external_process.hpp"
#include "../common/text_file.hpp"
#include "common/unique_fd.hpp"

namespace {

using namespace std::chrono_literals;
using gradlane::sidecar::UniqueFd;
using gradlane::testing::ExternalProcess;
using gradlane::testing::read_text_file;

const std::string kScratch = fmt::format("/tmp/gradlaned-service-test-{}", ::getpid());

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// An abstract datagram socket standing in for systemd's NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& name) : name_(name), fd_(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name.data(), name.size());
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    ok_ = fd_ && ::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&address), length) == 0;
  }
  bool ok() const { return ok_; }
  std::string variable() const { return "NOTIFY_SOCKET=@" + name_; }
  // The next datagram, or nullopt after `timeout`.
  std::optional<std::string> next(std::chrono::milliseconds timeout) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return std::nullopt;
    char buffer[512];
    const ssize_t n = ::recv(fd_.get(), buffer, sizeof buffer, 0);
    if (n < 0) return std::nullopt;
    return std::string(buffer, static_cast<std::size_t>(n));
  }

 private:
  std::string name_;
  UniqueFd fd_;
  bool ok_ = false;
};

// Whether `pid` said READY=1 within `timeout` (other datagrams are skipped).
bool ready(NotifySocket& notify, pid_t pid, std::chrono::milliseconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < give_up) {
    const auto said =
        notify.next(std::chrono::duration_cast<std::chrono::milliseconds>(give_up - std::chrono::steady_clock::now()));
    if (said && said->find("READY=1") != std::string::npos &&
        said->find(fmt::format("MAINPID={}", pid)) != std::string::npos) {
      return true;
    }
  }
  return false;
}

// gradlaned in the foreground, insecure (no peers here), with `env` (VAR=value) and `args`.
std::vector<std::string> gradlaned(const std::vector<std::string>& env, const std::string& shm,
                                   const std::vector<std::string>& args) {
  std::vector<std::string> argv{"/usr/bin/env", "GRADLANE_INSECURE=1"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.insert(argv.end(), {GRADLANE_TEST_GRADLANED, "--foreground", "--shm-name", shm});
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// Exit status if it exited within `timeout`, else -1 (and it is killed).
int exit_status(ExternalProcess& p, std::chrono::milliseconds timeout) {
  const auto status = p.wait_exit(timeout);
  if (!status) {
    p.kill_hard();
    return -1;
  }
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
}

TEST(GradlanedService, ItSaysReadyToSystemdOnceItServesAndStoppingOnSigterm) {
  NotifySocket notify(fmt::format("gradlane-notify-test-{}", ::getpid()));
  ASSERT_TRUE(notify.ok());
  ExternalProcess d(gradlaned({notify.variable()}, "/gradlane-service-test-a", {}), kScratch + "-a");
  ASSERT_TRUE(ready(notify, d.pid(), 20s)) << read_text_file(kScratch + "-a.err");
  EXPECT_NE(read_text_file(kScratch + "-a.err").find("serving"), std::string::npos) << "READY before the serving line";
  ::kill(d.pid(), SIGTERM);
  const auto stopping = notify.next(10s);
  ASSERT_TRUE(stopping);
  EXPECT_NE(stopping->find("STOPPING=1"), std::string::npos) << *stopping;
  EXPECT_EQ(exit_status(d, 10s), 0);
}

TEST(GradlanedService, ASecondDaemonForTheSameEndpointIsRefusedNamingTheFirst) {
  NotifySocket notify(fmt::format("gradlane-notify-test-b-{}", ::getpid()));
  ASSERT_TRUE(notify.ok());
  ExternalProcess first(gradlaned({notify.variable()}, "/gradlane-service-test-b1", {"--endpoint", "424242"}),
                        kScratch + "-b1");
  ASSERT_TRUE(ready(notify, first.pid(), 20s)) << read_text_file(kScratch + "-b1.err");
  {
    ExternalProcess second(gradlaned({}, "/gradlane-service-test-b2", {"--endpoint", "7", "--endpoint", "424242"}),
                           kScratch + "-b2");
    EXPECT_EQ(exit_status(second, 20s), 1);
    const std::string said = read_text_file(kScratch + "-b2.err");
    EXPECT_NE(said.find(fmt::format("endpoint 424242 is already claimed on this host, by pid {} (uid {})", first.pid(),
                                    ::getuid())),
              std::string::npos)
        << said;
  }
  // More refused claimants than the holder's backlog: each still exits at once (its probe of
  // the holder does not block), and an endpoint named twice by one daemon is claimed once.
  for (int i = 0; i < 8; ++i) {
    ExternalProcess again(gradlaned({}, "/gradlane-service-test-b2", {"--endpoint", "424242", "--endpoint", "424242"}),
                          kScratch + "-b2");
    ASSERT_EQ(exit_status(again, 20s), 1) << "claimant " << i << ": " << read_text_file(kScratch + "-b2.err");
  }
  // Its claim ends with it: a daemon after it takes the endpoint.
  ::kill(first.pid(), SIGTERM);
  ASSERT_EQ(exit_status(first, 10s), 0);
  ExternalProcess third(
      gradlaned({notify.variable()}, "/gradlane-service-test-b3", {"--endpoint", "424242", "--endpoint", "424242"}),
      kScratch + "-b3");
  ASSERT_TRUE(ready(notify, third.pid(), 20s)) << read_text_file(kScratch + "-b3.err");
  ::kill(third.pid(), SIGTERM);
  EXPECT_EQ(exit_status(third, 10s), 0);
}

TEST(GradlanedService, SighupReopensTheScheduleLogAfterItWasMovedAway) {
  NotifySocket notify(fmt::format("gradlane-notify-test-c-{}", ::getpid()));
  ASSERT_TRUE(notify.ok());
  const std::string log = kScratch + "-schedule.jsonl";
  ::unlink(log.c_str());
  ::unlink((log + ".1").c_str());
  ExternalProcess d(gradlaned({notify.variable()}, "/gradlane-service-test-c", {"--schedule-log", log}),
                    kScratch + "-c");
  ASSERT_TRUE(ready(notify, d.pid(), 20s)) << read_text_file(kScratch + "-c.err");
  ASSERT_TRUE(exists(log));
  ASSERT_EQ(::rename(log.c_str(), (log + ".1").c_str()), 0);  // what logrotate does
  ::kill(d.pid(), SIGHUP);
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!exists(log) && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(exists(log)) << "SIGHUP did not reopen the schedule log";
  ::kill(d.pid(), SIGTERM);
  EXPECT_EQ(exit_status(d, 10s), 0) << "SIGHUP must not stop it: " << read_text_file(kScratch + "-c.err");
  ::unlink(log.c_str());
  ::unlink((log + ".1").c_str());
}

// gradlaned started with its schedule log at `log` must exit 1 at once, saying `reason`.
void expect_schedule_log_refused(const std::string& log, const std::string& tag, const std::string& reason) {
  ExternalProcess d(gradlaned({}, "/gradlane-service-test-" + tag, {"--schedule-log", log}), kScratch + "-" + tag);
  EXPECT_EQ(exit_status(d, 20s), 1) << "it must refuse the log at once, not wait on it";
  const std::string said = read_text_file(kScratch + "-" + tag + ".err");
  EXPECT_NE(said.find(reason), std::string::npos) << said;
}

// A link planted where the log goes, to a file that must keep its bytes.
void expect_linked_schedule_log_refused(decltype(&::link) make_link, const std::string& tag,
                                        const std::string& reason) {
  const std::string target = kScratch + "-" + tag + "-victim";
  const std::string log = kScratch + "-" + tag + ".jsonl";
  std::ofstream(target) << "not to be truncated\n";
  ::unlink(log.c_str());
  ASSERT_EQ(make_link(target.c_str(), log.c_str()), 0);
  expect_schedule_log_refused(log, tag, reason);
  EXPECT_EQ(read_text_file(target), "not to be truncated\n");
  ::unlink(log.c_str());
  ::unlink(target.c_str());
}

// A FIFO where the log goes: refused without blocking on the open for a reader.
TEST(GradlanedService, AScheduleLogThatIsAFifoIsRefused) {
  const std::string fifo = kScratch + "-fifo.jsonl";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_schedule_log_refused(fifo, "f", "not a regular file");
  ::unlink(fifo.c_str());
}

TEST(GradlanedService, AScheduleLogThatIsAHardLinkIsRefused) {
  expect_linked_schedule_log_refused(&::link, "g", "has other links");
}

TEST(GradlanedService, AScheduleLogThatIsASymbolicLinkIsRefused) {
  expect_linked_schedule_log_refused(&::symlink, "d", "is a symbolic link");
}

// Its stderr a pipe whose reader has exited: every log line fails (EPIPE, or SIGPIPE were it
// not ignored), and it serves and stops as usual. bash execs it, so the pid is gradlaned's.
TEST(GradlanedService, AClosedStderrNeitherKillsNorStopsIt) {
  NotifySocket notify(fmt::format("gradlane-notify-test-e-{}", ::getpid()));
  ASSERT_TRUE(notify.ok());
  std::string command = "exec 2> >(exec true); sleep 0.3; exec";
  for (const std::string& word : gradlaned({notify.variable()}, "/gradlane-service-test-e", {})) {
    command += " '" + word + "'";
  }
  ExternalProcess shell({"/bin/bash", "-c", command}, kScratch + "-e");
  ASSERT_TRUE(ready(notify, shell.pid(), 20s)) << "it died writing to its closed stderr";
  ::kill(shell.pid(), SIGTERM);
  EXPECT_EQ(exit_status(shell, 10s), 0);
}

// --config FILE: TOML, the long option names; the command line wins; --check-config prints
// every option as a file that reads back to the same, and starts nothing.
std::pair<int, std::string> check_config(const std::vector<std::string>& args, const std::string& tag) {
  std::vector<std::string> argv{"/usr/bin/env",          "-u",
                                "GRADLANE_JOB_KEY",      "-u",
                                "GRADLANE_JOB_KEY_FILE", "GRADLANE_INSECURE=0",
                                GRADLANE_TEST_GRADLANED, "--check-config"};
  argv.insert(argv.end(), args.begin(), args.end());
  ExternalProcess p(argv, kScratch + tag);
  const int status = exit_status(p, 20s);
  return {status, read_text_file(kScratch + tag + ".out") + read_text_file(kScratch + tag + ".err")};
}

TEST(GradlanedConfig, AFilesOptionsAreTakenTheCommandLineWinsAndThePrintedFileReadsBack) {
  const std::string file = kScratch + "-config.toml";
  std::ofstream(file) << "endpoint = [5, 6]\ninsecure = true\nstaleness-bound = 9\nlisten-port = 7711\n";
  const auto [status, said] = check_config({"--config", file, "--staleness-bound", "11"}, "-f1");
  ASSERT_EQ(status, 0) << said;
  EXPECT_NE(said.find("\nendpoint=[5, 6]\n"), std::string::npos) << said;
  EXPECT_NE(said.find("\nlisten-port=7711\n"), std::string::npos) << said;
  EXPECT_NE(said.find("\nstaleness-bound=11\n"), std::string::npos) << said;
  EXPECT_NE(said.find("\nmax-outstanding=4096\n"), std::string::npos) << "defaults are printed too: " << said;
  EXPECT_EQ(said.find("serving"), std::string::npos) << "it must not start";
  // What it printed, given back, prints the same.
  const std::string printed = read_text_file(kScratch + "-f1.out");
  const std::string again = kScratch + "-again.toml";
  std::ofstream(again) << printed;
  const auto [status2, said2] = check_config({"--config", again}, "-f2");
  ASSERT_EQ(status2, 0) << said2;
  EXPECT_EQ(read_text_file(kScratch + "-f2.out"), printed);
  ::unlink(file.c_str());
  ::unlink(again.c_str());
}

TEST(GradlanedConfig, AMisspeltNameABadValueOrAMissingKeyIsRefusedNamingIt) {
  const std::string file = kScratch + "-bad.toml";
  std::ofstream(file) << "endpont = 3\ninsecure = true\n";
  auto [status, said] = check_config({"--config", file}, "-b1");
  EXPECT_NE(status, 0);
  EXPECT_NE(said.find("endpont"), std::string::npos) << said;
  std::ofstream(file) << "replica-bound = \"x\"\ninsecure = true\n";
  std::tie(status, said) = check_config({"--config", file}, "-b2");
  EXPECT_NE(status, 0);
  EXPECT_NE(said.find("replica-bound"), std::string::npos) << said;
  std::ofstream(file) << "endpoint = [1]\n";  // no key, not insecure
  std::tie(status, said) = check_config({"--config", file}, "-b3");
  EXPECT_EQ(status, 1);
  EXPECT_NE(said.find("no job key"), std::string::npos) << said;
  ::unlink(file.c_str());
}

// --standby names the job whose replica may take the sequence over: a bare endpoint is refused.
TEST(GradlanedConfig, AStandbyWithoutItsJobIsRefusedSayingTheForm) {
  auto [status, said] = check_config({"--insecure", "--standby", "0"}, "-s1");
  EXPECT_EQ(status, 1);
  EXPECT_NE(said.find("--standby '0': expected ENDPOINT:JOB"), std::string::npos) << said;
  std::tie(status, said) = check_config({"--insecure", "--standby", "0:7"}, "-s2");
  EXPECT_EQ(status, 0) << said;
  EXPECT_NE(said.find("standby=\"0:7\""), std::string::npos) << said;
}

// --ingress-sharing picks how a server's ingress is shared; anything but its two words is refused.
TEST(GradlanedConfig, IngressSharingIsExclusiveOrPacked) {
  auto [status, said] = check_config({"--insecure"}, "-i1");
  EXPECT_EQ(status, 0) << said;
  EXPECT_NE(said.find("ingress-sharing=\"exclusive\""), std::string::npos) << "the default: " << said;
  std::tie(status, said) = check_config({"--insecure", "--ingress-sharing", "packed"}, "-i2");
  EXPECT_EQ(status, 0) << said;
  EXPECT_NE(said.find("ingress-sharing=\"packed\""), std::string::npos) << said;
  std::tie(status, said) = check_config({"--insecure", "--ingress-sharing", "lanes"}, "-i3");
  EXPECT_NE(status, 0);
  EXPECT_NE(said.find("--ingress-sharing"), std::string::npos) << said;
  EXPECT_NE(said.find("packed"), std::string::npos) << "names the choices: " << said;
}

// --job-sharing picks how a host NIC is shared between jobs; strict priority needs its order,
// and the order it was given is what --check-config prints back.
TEST(GradlanedConfig, JobSharingIsShortestRemainingFairOrPriorityInAGivenOrder) {
  auto [status, said] = check_config({"--insecure"}, "-j1");
  EXPECT_EQ(status, 0) << said;
  EXPECT_NE(said.find("job-sharing=\"shortest-remaining\""), std::string::npos) << "the default: " << said;
  std::tie(status, said) = check_config({"--insecure", "--job-sharing", "priority"}, "-j2");
  EXPECT_EQ(status, 1);
  EXPECT_NE(said.find("--job-sharing priority needs --job-priority"), std::string::npos) << said;
  std::tie(status, said) = check_config({"--insecure", "--job-sharing", "priority", "--job-priority", "2,3,1"}, "-j3");
  EXPECT_EQ(status, 0) << said;
  EXPECT_NE(said.find("job-priority=[2, 3, 1]"), std::string::npos) << said;
  std::tie(status, said) = check_config({"--insecure", "--job-sharing", "priority", "--job-priority", "2,2"}, "-j4");
  EXPECT_EQ(status, 1);
  EXPECT_NE(said.find("names a job twice"), std::string::npos) << said;
  std::tie(status, said) = check_config({"--insecure", "--job-priority", "2,3"}, "-j6");
  EXPECT_EQ(status, 1) << "an order without strict priority would be silently ignored: " << said;
  EXPECT_NE(said.find("--job-priority orders jobs only under --job-sharing priority"), std::string::npos) << said;
  std::tie(status, said) = check_config({"--insecure", "--job-sharing", "round-robin"}, "-j5");
  EXPECT_NE(status, 0);
  EXPECT_NE(said.find("fair"), std::string::npos) << "names the choices: " << said;
}

}  // namespace
