#include "harness.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "sidecar/daemon/signals.hpp"
#include "sidecar/shm/door.hpp"
#include "sidecar/shm/segment.hpp"

extern char** environ;

namespace gradlane::sidecar::test {

std::string unique_shm_name() {
  static std::atomic<int> counter{0};
  return "/gradlane-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

DaemonConfig test_config(const std::string& shm_name) {
  DaemonConfig c;
  c.shm_name = shm_name;
  c.max_apps = 8;
  c.idle_spin = std::chrono::microseconds(50);
  c.idle_sleep = std::chrono::milliseconds(5);
  return c;
}

AttachOptions test_attach(const std::string& shm_name, std::uint32_t job) {
  AttachOptions o;
  o.shm_name = shm_name;
  o.job = job;
  o.endpoint = 1;
  o.region_bytes = 1 << 20;
  o.attach_timeout = std::chrono::milliseconds(2000);
  return o;
}

Update small_update(std::uint32_t tensor) {
  return Update{.tensor = tensor,
                .receiver = 9,
                .bytes = 4096,
                .region_offset = 0,
                .computed_on = 0,
                .gradient_norm = 1.0F,
                .priority = 0};
}

sched::SchedulerConfig no_replica() {
  sched::SchedulerConfig sc;
  sc.replica_bound = std::nullopt;
  return sc;
}

std::vector<std::uint64_t> take_and_complete(Client& app, std::size_t count) {
  std::vector<std::uint64_t> sequences;
  for (std::size_t i = 0; i < count; ++i) {
    const Grant g = app.wait(std::chrono::seconds(2));
    if (g.kind != GrantKind::go) {
      throw std::runtime_error(fmt::format("expected a go, got {} ({})", kind_name(g.kind), reason_name(g.reason)));
    }
    sequences.push_back(g.sequence);
    app.complete(g.request, g.part_index, std::chrono::microseconds(10));
  }
  return sequences;
}

void kill_granted_sender(DaemonDriver& driver, Child& sender) {
  sender.kill_now();
  auto hold = driver.hold();
  driver.step_far_ahead();  // reclaims the dead app: its transfer fails back
  driver.step();            // the next schedule() emits the Cancel
}

DaemonDriver::DaemonDriver(DaemonConfig config, std::unique_ptr<sched::Policy> policy)
    : daemon_(std::make_unique<Daemon>(std::move(config),
                                       policy ? std::move(policy) : std::make_unique<sched::PassThroughPolicy>())) {
  thread_ = std::thread([this] {
    while (!quit_.load()) {
      std::size_t work = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (daemon_) {
          work = daemon_->step(Daemon::clock_now() + skew_);
          if (work == 0) daemon_->wait_for_work(std::chrono::microseconds(200));
        }
      }
      if (work == 0) std::this_thread::yield();
    }
  });
}

DaemonDriver::~DaemonDriver() { stop(); }

bool DaemonDriver::credit_returned(std::uint32_t endpoint, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      auto& scheduler = dynamic_cast<sched::SchedulerPolicy&>(daemon_->policy()).scheduler();
      if (scheduler.in_flight(sched::EndpointId{endpoint}) == 0) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::size_t DaemonDriver::step_far_ahead() {
  // Later steps by the thread must not go back in time (the policy treats `now` as monotonic).
  skew_ += std::chrono::seconds(10);
  return daemon_->step(Daemon::clock_now() + skew_);
}

void DaemonDriver::pause() {
  quit_.store(true);
  if (thread_.joinable()) thread_.join();
}

void DaemonDriver::stop() {
  pause();
  daemon_.reset();
}

Child::Child(const std::string& role, const std::vector<std::string>& args) {
  int fds[2];
  int go[2];
  if (::pipe2(fds, O_CLOEXEC) != 0 || ::pipe2(go, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  ready_fd_ = fds[0];
  go_fd_ = go[1];
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 3);  // dup2 clears CLOEXEC on fds 3 and 4
  posix_spawn_file_actions_adddup2(&actions, go[0], 4);
  std::vector<std::string> argv_storage{"/proc/self/exe", "--child=" + role};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int err = ::posix_spawn(&pid_, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  ::close(go[0]);
  if (err != 0) throw std::runtime_error(std::string("posix_spawn failed: ") + std::strerror(err));
}

Child::~Child() {
  kill_now();
  if (ready_fd_ >= 0) ::close(ready_fd_);
  if (go_fd_ >= 0) ::close(go_fd_);
}

void Child::go() {
  const char byte = 1;
  if (::write(go_fd_, &byte, 1) != 1) throw std::runtime_error("the child is gone");
}

bool Child::ready(std::chrono::milliseconds timeout) {
  pollfd p{ready_fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  char byte = 0;
  return ::read(ready_fd_, &byte, 1) == 1;
}

int Child::terminate() {
  if (pid_ <= 0 || reaped_) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  reaped_ = true;
  return status;
}

int Child::wait_exit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0 || reaped_) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      return status;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Child::kill_now() {
  if (pid_ <= 0 || reaped_) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  reaped_ = true;
}

namespace {

std::string arg(int argc, char** argv, std::string_view key) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a(argv[i]);
    if (a.substr(0, key.size()) == key && a.size() > key.size() && a[key.size()] == '=') {
      return std::string(a.substr(key.size() + 1));
    }
  }
  return {};
}

void tell_ready() {
  const char byte = 1;
  if (::write(3, &byte, 1) != 1) ::_exit(3);
}

void await_go() {
  char byte = 0;
  if (::read(4, &byte, 1) != 1) ::_exit(3);
}

[[noreturn]] void park() {
  for (;;) ::pause();
}

}  // namespace

int run_child(int argc, char** argv) {
  const std::string role = arg(argc, argv, "--child");
  const std::string shm = arg(argc, argv, "--shm");
  try {
    if (role == "app-queue") {
      // Attach, wait for the test (it stops stepping the daemon), queue `--entries` requests,
      // say so, and wait to be killed with them queued.
      Client client = Client::attach(test_attach(shm, 1));
      await_go();
      const int entries = std::stoi(arg(argc, argv, "--entries"));
      for (int i = 0; i < entries; ++i) client.request(small_update(static_cast<std::uint32_t>(i)));
      tell_ready();
      park();
    }
    if (role == "app-granted") {
      // Attach from endpoint 3, get a 1 MiB transfer granted, and die without completing it.
      AttachOptions o = test_attach(shm, 1);
      o.endpoint = 3;
      Client client = Client::attach(o);
      Update u = small_update();
      u.bytes = 1 << 20;
      client.request(u);
      if (client.wait(std::chrono::seconds(5)).kind != GrantKind::go) return 4;
      tell_ready();
      park();
    }
    if (role == "app-detach") {
      // Attach, detach cleanly, and exit at once: the daemon may see the exit before the detach.
      Client client = Client::attach(test_attach(shm, 1));
      client.detach();
      return 0;
    }
    if (role == "app-serves") {
      // Attach as the server of endpoint 9 (2 slots) of job 1, say so, and wait to be killed.
      AttachOptions o = test_attach(shm, 1);
      o.endpoint = 9;
      o.slots = 2;
      Client client = Client::attach(o);
      tell_ready();
      park();
    }
    if (role == "app-takes-over") {
      // Attach as the server of endpoint 9 (4 slots) of job --job (1 if not given) taking its
      // sequence over at version 6: 0 if accepted, 21 if refused with bad_takeover.
      const std::string job = arg(argc, argv, "--job");
      AttachOptions o = test_attach(shm, job.empty() ? 1 : static_cast<std::uint32_t>(std::stoul(job)));
      o.endpoint = 9;
      o.slots = 4;
      o.take_over_at = 6;
      try {
        Client client = Client::attach(o);
        return 0;
      } catch (const Error& e) {
        std::fprintf(stderr, "child app-takes-over: %s\n", e.what());
        return std::string_view(e.what()).find("bad_takeover") != std::string_view::npos ? 21 : 5;
      }
    }
    if (role == "app-as-user") {
      // Become --uid (a job's user: --job-user), then --try one thing against job --job:
      //   attach     attach and get one go: 0; refused because this user may not map the job's
      //              segment: 20; refused own_segment: 21; the segment or the door is another
      //              user's making, not trusted: 23
      //   knock      ask gradlaned's door for the job's segment: 0 granted, 22 refused
      //   resize     as knock, then try to shrink and to grow the segment it was given: 0 if
      //              both are refused with EPERM and the seals are sealed too, 24 otherwise
      //   squat-door bind the door's address and hold it until killed (ready once bound)
      // --netns=1: first move to a network namespace of its own (as an app in a container that
      // shares the host's /dev/shm but not its network): 25 if the kernel refuses.
      const auto uid = static_cast<uid_t>(std::stoul(arg(argc, argv, "--uid")));
      const auto job = static_cast<std::uint32_t>(std::stoul(arg(argc, argv, "--job")));
      const std::string what = arg(argc, argv, "--try");
      if (arg(argc, argv, "--netns") == "1" && ::unshare(CLONE_NEWNET) != 0) return 25;
      if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) return 3;  // no root groups kept
      if (what == "attach") {
        try {
          Client client = Client::attach(test_attach(shm, job));
          client.request(small_update());
          return client.wait(std::chrono::seconds(5)).kind == GrantKind::go ? 0 : 4;
        } catch (const Error& e) {
          std::fprintf(stderr, "child app-as-user uid %u job %u: %s\n", uid, job, e.what());
          const std::string_view message = e.what();
          if (message.find("may not map it") != std::string_view::npos) return 20;
          if (message.find("own_segment") != std::string_view::npos) return 21;
          if (message.find("neither this process's") != std::string_view::npos) return 23;
          return 5;
        }
      }
      if (what == "squat-door") {
        const shm::DoorAddress door = shm::door_address(shm);
        UniqueFd squat(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!squat || ::bind(squat.get(), reinterpret_cast<const sockaddr*>(&door.address), door.length) != 0 ||
            ::listen(squat.get(), 4) != 0) {
          return 6;
        }
        tell_ready();
        for (;;) ::pause();
      }
      shm::DoorAnswer answer = shm::ask_door(shm, job, std::chrono::seconds(2));
      if (answer.kind == shm::DoorAnswer::Kind::not_your_job) return 22;
      if (answer.kind != shm::DoorAnswer::Kind::granted) return 6;
      if (what == "knock") return 0;
      if (what == "resize") {
        struct stat st {};
        if (::fstat(answer.segment.get(), &st) != 0) return 6;
        const bool shrink_refused = ::ftruncate(answer.segment.get(), 0) != 0 && errno == EPERM;
        const bool grow_refused = ::ftruncate(answer.segment.get(), st.st_size * 2) != 0 && errno == EPERM;
        const int seals = ::fcntl(answer.segment.get(), F_GET_SEALS);
        const bool sealed_for_good = seals >= 0 && (seals & F_SEAL_SEAL) != 0;  // no seal lifted or added
        return shrink_refused && grow_refused && sealed_for_good ? 0 : 24;
      }
      return 2;
    }
    if (role == "daemon") {
      // A whole gradlaned in a process of its own, so a test can SIGKILL it.
      DaemonSignals signals;
      DaemonConfig config = test_config(shm);
      // --job-user=JOB:UID: that job gets a segment of its own (gradlaned's own parser).
      if (const std::string job_user = arg(argc, argv, "--job-user"); !job_user.empty()) {
        config.job_segments.push_back(parse_job_user(job_user));
      }
      std::unique_ptr<sched::Policy> policy = std::make_unique<sched::PassThroughPolicy>();
      if (arg(argc, argv, "--policy") == "scheduler") policy = std::make_unique<sched::SchedulerPolicy>(no_replica());
      Daemon daemon(config, std::move(policy));
      tell_ready();
      daemon.run([&] { return signals.received().has_value(); });
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child %s: %s\n", role.c_str(), e.what());
    return 2;
  }
  std::fprintf(stderr, "unknown child role '%s'\n", role.c_str());
  return 2;
}

}  // namespace gradlane::sidecar::test
