// gradlane_sidecar_load: requests/s through one gradlaned with 1 application and with N
// (the target: "throughput stays within 10 % of the 1-app figure per app share"), and
// gradlaned's peak RSS.
//
//   gradlane_sidecar_load [--apps 1,8] [--updates 10000] [--reps 5] [--window 64] [--client-spin-us 50]
//                         [--policy scheduler|passthrough] [--staleness-bound 0] [--gradlaned PATH]
//                         [--pin-daemon CPU]
//
// Each repetition starts a fresh gradlaned process (so its VmHWM is that run's peak), runs the
// apps — threads of this process, each with its own Client and app slot — and stops it with
// SIGTERM. An app keeps up to --window requests unanswered, completes every go at once (as a
// worker does after its write), and counts a request done at its answer (go or drop; an
// error fails the run). Per app: requests / (its first request -> its last answer); total:
// all requests / (first request -> last answer of any app). The share ratio of an app in an
// N-app run is its rate / (the 1-app rate / N): 1.0 = it gets its fair share of what one app
// alone gets; the target is >= 0.9. Also printed: the slowest app's rate / the 1-app rate (what
// an app keeps of its own speed among N; 1.0 = sharing the daemon costs it nothing). Figures
// are median [min-max] over the repetitions (requests/s per app: over every app of every rep).
//
// --hostile runs every repetition three times, alternated: as above (quiet); with one more app
// of another job that abuses the daemon as far as it lets an app — it asks for the largest
// update gradlaned takes (--max-update-bytes, 16 GiB: 4,096 parts each) from a region it
// declares that large, again and again past its owed-bytes bound (each refusal is an error
// answer), and never completes a grant, so its credit is never returned; and, the control, with
// that app attached and waking as often but asking for nothing (what one more process costs the
// others on this machine, whatever it asks). It reports the polite apps' request latency
// (request -> answer) median and p99 in each: the target is within 1.2x of quiet; hostile /
// control is what the abuse costs beyond a polite neighbour.
//
// --pin-daemon CPU puts gradlaned on that CPU alone and the apps on every other one, as a
// sidecar is deployed (a core of its own, like eRPC's or Snap's dispatch threads). Unpinned, on
// a machine with fewer cores than apps + 1, the figure measures the kernel's time-sharing of the
// daemon with the apps that feed it as much as the daemon.
#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gradlane/sidecar.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace sc = gradlane::sidecar;

struct Options {
  std::vector<std::uint32_t> apps{1, 8};
  std::uint64_t updates = 10'000;
  std::uint32_t reps = 5;
  std::uint64_t window = 64;
  std::uint32_t client_spin_us = 50;  // AttachOptions::spin (the default)
  std::string policy = "scheduler";
  // gradlaned --staleness-bound: 0 (unbounded) by default, so every request takes the whole
  // path (grant, slot, credit, completion): at tau 64, 8 apps x 64 in flight are mostly
  // dropped at once, which is cheaper and would flatter the 8-app figure.
  std::uint32_t staleness_bound = 0;
  std::string gradlaned = GRADLANE_GRADLANED;
  std::optional<int> pin_daemon;  // gradlaned on this CPU, the apps on the others
  bool hostile = false;
  std::uint32_t hostile_refill_us = 100;  // the hostile app's sleep between two refills of its queue
};

// Who shares the daemon with the polite apps in a repetition (--hostile).
enum class Neighbour { none, idle, hostile };

constexpr std::uint64_t kHostileUpdateBytes = std::uint64_t{16} << 30;  // gradlaned's --max-update-bytes default

// The CPUs this process may run on, without `cpu`.
cpu_set_t cpus_without(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) throw std::runtime_error("sched_getaffinity failed");
  CPU_CLR(cpu, &set);
  if (CPU_COUNT(&set) == 0) {
    throw std::runtime_error(fmt::format("--pin-daemon {}: no CPU left for the apps (this process may use {} CPU)", cpu,
                                         CPU_COUNT(&set) + 1));
  }
  return set;
}

// A gradlaned process of its own, stopped (SIGTERM) and reaped by the destructor.
class DaemonProcess {
 public:
  DaemonProcess(const Options& o, const std::string& shm) {
    const std::string& binary = o.gradlaned;
    std::vector<std::string> args{binary,
                                  "--foreground",
                                  "--shm-name",
                                  shm,
                                  "--policy",
                                  o.policy,
                                  "--max-apps",
                                  "16",
                                  "--staleness-bound",
                                  std::to_string(o.staleness_bound)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (const int err = ::posix_spawn(&pid_, binary.c_str(), nullptr, nullptr, argv.data(), environ); err != 0) {
      throw std::runtime_error(fmt::format("posix_spawn {}: error {}", binary, err));
    }
    if (o.pin_daemon) {
      // gradlaned has one thread: its main thread's affinity is the daemon's. Set before it
      // serves anything (the apps start after the attach pause).
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(*o.pin_daemon, &set);
      if (::sched_setaffinity(pid_, sizeof set, &set) != 0) {
        ::kill(pid_, SIGTERM);
        ::waitpid(pid_, nullptr, 0);
        throw std::runtime_error(fmt::format(
            "--pin-daemon {}: sched_setaffinity failed (is CPU {} online and allowed?)", *o.pin_daemon, *o.pin_daemon));
      }
    }
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;
  ~DaemonProcess() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  // CPU seconds its main thread (gradlaned's loop: it has no other) ran so far, from
  // /proc/<pid>/schedstat (nanoseconds; /proc/<pid>/stat counts 10 ms ticks, too coarse here).
  double cpu_seconds() const {
    std::ifstream in(fmt::format("/proc/{}/schedstat", pid_));
    std::uint64_t ns = 0;
    in >> ns;
    return static_cast<double>(ns) * 1e-9;
  }
  // /proc/<pid>/status VmHWM (peak resident set), in KiB; 0 if unreadable.
  std::uint64_t peak_rss_kib() const {
    std::ifstream in(fmt::format("/proc/{}/status", pid_));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6));
    }
    return 0;
  }

 private:
  pid_t pid_ = -1;
};

struct AppRun {
  Clock::time_point start, end;
  std::uint64_t go = 0, dropped = 0;
  std::vector<double> latency_us;  // request -> answer, per request
};

// One application: `updates` requests, at most `window` unanswered.
AppRun run_app(const std::string& shm, std::uint32_t job, const Options& o, std::atomic<bool>& start) {
  sc::AttachOptions attach;
  attach.shm_name = shm;
  attach.job = job;
  attach.endpoint = 1;
  attach.region_bytes = 1 << 20;
  attach.attach_timeout = 5s;  // gradlaned may still be starting
  attach.spin = std::chrono::microseconds(o.client_spin_us);
  sc::Client client = sc::Client::attach(attach);
  sc::Update update{.tensor = 1,
                    .receiver = 2,
                    .bytes = 4096,
                    .region_offset = 0,
                    .computed_on = 0,
                    .gradient_norm = 1.0F,
                    .priority = 0};
  while (!start.load(std::memory_order_acquire)) std::this_thread::yield();
  AppRun run;
  run.latency_us.reserve(o.updates);
  std::unordered_map<std::uint64_t, Clock::time_point> asked;  // request id -> when
  run.start = Clock::now();
  std::uint64_t submitted = 0, answered = 0;
  const auto take = [&](const sc::Grant& g) {
    if (g.kind == sc::GrantKind::error) {
      throw std::runtime_error(fmt::format("request {} refused: {}", g.request, sc::reason_name(g.reason)));
    }
    if (const auto it = asked.find(g.request); it != asked.end()) {
      run.latency_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - it->second).count());
      asked.erase(it);
    }
    ++answered;
    if (g.kind == sc::GrantKind::drop) {
      ++run.dropped;
      return;
    }
    ++run.go;
    update.computed_on = std::max(update.computed_on, g.sequence);  // as if it pulled after each update
    // The queue to the daemon may be full of our own requests: it drains within microseconds.
    client.complete(g.request, g.part_index, 1us, false, 1s);
  };
  while (answered < o.updates) {
    while (submitted < o.updates && submitted - answered < o.window) {
      try {
        // Nothing owed to us means the queue is full of our own completions, which the daemon
        // drains at once: wait for room (waiting for an answer would wait for nothing).
        const auto at = Clock::now();
        asked.emplace(
            client.request(update, submitted == answered ? std::chrono::nanoseconds(1s) : std::chrono::nanoseconds(0)),
            at);
        ++submitted;
      } catch (const gradlane::Error& e) {
        if (e.code() != gradlane::Errc::resource_exhausted) throw;
        break;
      }
    }
    take(client.wait(10s));
    while (auto g = client.poll()) take(*g);
  }
  run.end = Clock::now();
  return run;
}

struct HostileRun {
  std::uint64_t requests = 0, refused = 0, granted = 0;
};

// The hostile app (see --hostile): job 99, its own NIC and server (the polite apps' server,
// attached for their job, would refuse another job's requests: receiver_of_another_job); largest
// updates, never completed, until told to stop. It keeps its request
// queue full for the daemon and sleeps --hostile-refill-us (100) between refills, so what it
// costs the others is the daemon's work, not a spinning core.
HostileRun run_hostile(const std::string& shm, const Options& o, bool idle, std::atomic<bool>& start,
                       const std::atomic<bool>& stop) {
  sc::AttachOptions attach;
  attach.shm_name = shm;
  attach.job = 99;
  attach.endpoint = 3;
  attach.region_bytes = kHostileUpdateBytes;  // declared, never backed: nothing checks it is real
  attach.attach_timeout = 5s;
  attach.spin = std::chrono::microseconds(o.client_spin_us);
  sc::Client client = sc::Client::attach(attach);
  const sc::Update update{.tensor = 7,
                          .receiver = 4,  // its own job's server: another job's would refuse it
                          .bytes = kHostileUpdateBytes,
                          .region_offset = 0,
                          .computed_on = 0,
                          .gradient_norm = 1.0F,
                          .priority = 0};
  while (!start.load(std::memory_order_acquire)) std::this_thread::yield();
  HostileRun run;
  while (!stop.load(std::memory_order_acquire)) {
    // Fill the request queue (each one a 16 GiB update), take what came back, sleep: a queue
    // kept full for the daemon, at little CPU of its own.
    for (; !idle;) {
      try {
        (void)client.request(update, std::chrono::nanoseconds(0));
        ++run.requests;
      } catch (const gradlane::Error& e) {
        if (e.code() != gradlane::Errc::resource_exhausted) throw;
        break;
      }
    }
    while (auto g = client.poll()) {
      if (g->kind == sc::GrantKind::error) ++run.refused;
      if (g->kind == sc::GrantKind::go) ++run.granted;  // and never completed
    }
    std::this_thread::sleep_for(std::chrono::microseconds(o.hostile_refill_us));
  }
  return run;
}

struct RepResult {
  double total_per_s = 0;
  std::vector<double> app_per_s;
  std::uint64_t go = 0, dropped = 0;
  std::uint64_t peak_rss_kib = 0;
  double daemon_cpu_share = 0;     // gradlaned's CPU seconds / wall seconds of the run
  double per_daemon_cpu_s = 0;     // requests per CPU second of gradlaned
  std::vector<double> latency_us;  // every polite request's
  std::optional<HostileRun> hostile;
};

RepResult run_rep(std::uint32_t apps, const Options& o, int rep, Neighbour neighbour) {
  const std::string shm = fmt::format("/gradlane-load-{}-{}-{}-{}", ::getpid(), apps, rep, static_cast<int>(neighbour));
  DaemonProcess daemon(o, shm);
  std::atomic<bool> start{false}, stop_hostile{false};
  std::vector<AppRun> runs(apps);
  std::vector<std::string> failures(apps);
  std::optional<HostileRun> hostile_run;
  std::string hostile_failure;
  std::optional<std::jthread> hostile;
  if (neighbour != Neighbour::none) {
    hostile.emplace([&] {
      try {
        hostile_run = run_hostile(shm, o, neighbour == Neighbour::idle, start, stop_hostile);
      } catch (const std::exception& e) {
        hostile_failure = e.what();
      }
    });
  }
  double cpu_at_start = 0;
  {
    std::vector<std::jthread> threads;
    const std::optional<cpu_set_t> app_cpus = o.pin_daemon ? std::optional(cpus_without(*o.pin_daemon)) : std::nullopt;
    for (std::uint32_t a = 0; a < apps; ++a) {
      threads.emplace_back([&, a] {
        if (app_cpus && ::pthread_setaffinity_np(::pthread_self(), sizeof *app_cpus, &*app_cpus) != 0) {
          failures[a] = "pthread_setaffinity_np failed for an app thread";
          start.store(true);
          return;
        }
        try {
          runs[a] = run_app(shm, a + 1, o, start);
        } catch (const std::exception& e) {
          failures[a] = e.what();
          start.store(true);  // do not leave the others waiting for a start that depends on us
        }
      });
    }
    // Everyone attaches first; then all start together.
    std::this_thread::sleep_for(200ms);
    cpu_at_start = daemon.cpu_seconds();
    start.store(true, std::memory_order_release);
  }
  const double daemon_cpu = daemon.cpu_seconds() - cpu_at_start;
  stop_hostile.store(true, std::memory_order_release);
  hostile.reset();  // joins it
  for (const auto& f : failures) {
    if (!f.empty()) throw std::runtime_error(f);
  }
  if (!hostile_failure.empty()) throw std::runtime_error("the hostile app: " + hostile_failure);
  RepResult r;
  r.hostile = hostile_run;
  auto first = runs[0].start, last = runs[0].end;
  for (const AppRun& run : runs) {
    first = std::min(first, run.start);
    last = std::max(last, run.end);
    r.app_per_s.push_back(static_cast<double>(o.updates) / std::chrono::duration<double>(run.end - run.start).count());
    r.go += run.go;
    r.dropped += run.dropped;
    r.latency_us.insert(r.latency_us.end(), run.latency_us.begin(), run.latency_us.end());
  }
  r.total_per_s = static_cast<double>(o.updates * apps) / std::chrono::duration<double>(last - first).count();
  r.peak_rss_kib = daemon.peak_rss_kib();
  const double wall = std::chrono::duration<double>(last - first).count();
  r.daemon_cpu_share = daemon_cpu / wall;
  r.per_daemon_cpu_s = daemon_cpu > 0 ? static_cast<double>(o.updates * apps) / daemon_cpu : 0;
  return r;
}

// The q-quantile (nearest rank) of `v`.
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

// "median [min-max]" of `v`.
std::string spread(std::vector<double> v, const char* format) {
  std::sort(v.begin(), v.end());
  const auto f = [&](double x) { return fmt::format(fmt::runtime(format), x); };
  return fmt::format("{} [{}-{}]", f(v[v.size() / 2]), f(v.front()), f(v.back()));
}

// --hostile: per app count, quiet, control and hostile repetitions alternated, the polite apps'
// latency.
int hostile_comparison(const Options& o) {
  fmt::print(
      "| apps | latency p50 quiet / control / hostile (us) | p50 hostile / quiet | p50 hostile / control | latency "
      "p99 quiet / control / hostile (us) | p99 hostile / quiet | p99 hostile / control | gradlaned CPU (cores) "
      "quiet / control / hostile | hostile app: requests, refused, granted per rep "
      "|\n|---|---|---|---|---|---|---|---|---|\n");
  constexpr Neighbour kOrder[] = {Neighbour::none, Neighbour::idle, Neighbour::hostile};
  for (const std::uint32_t apps : o.apps) {
    std::vector<double> p50[3], p99[3], cpu[3];
    HostileRun abuse;
    for (std::uint32_t rep = 0; rep < o.reps; ++rep) {
      for (const Neighbour neighbour : kOrder) {
        const RepResult r = run_rep(apps, o, static_cast<int>(rep), neighbour);
        const auto i = static_cast<std::size_t>(neighbour);
        p50[i].push_back(quantile(r.latency_us, 0.5));
        p99[i].push_back(quantile(r.latency_us, 0.99));
        cpu[i].push_back(r.daemon_cpu_share);
        if (r.hostile && neighbour == Neighbour::hostile) {
          abuse.requests += r.hostile->requests;
          abuse.refused += r.hostile->refused;
          abuse.granted += r.hostile->granted;
        }
      }
    }
    const auto median = [](std::vector<double> v) { return quantile(std::move(v), 0.5); };
    const auto three = [](const std::vector<double>* v, const char* format) {
      return fmt::format("{} / {} / {}", spread(v[0], format), spread(v[1], format), spread(v[2], format));
    };
    fmt::print("| {} | {} | {:.2f} | {:.2f} | {} | {:.2f} | {:.2f} | {} | {}, {}, {} |\n", apps, three(p50, "{:.0f}"),
               median(p50[2]) / median(p50[0]), median(p50[2]) / median(p50[1]), three(p99, "{:.0f}"),
               median(p99[2]) / median(p99[0]), median(p99[2]) / median(p99[1]), three(cpu, "{:.2f}"),
               abuse.requests / o.reps, abuse.refused / o.reps, abuse.granted / o.reps);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  CLI::App cli{"Requests/s through one gradlaned with 1 and with N applications, and gradlaned's peak RSS."};
  cli.add_option("--apps", o.apps, "application counts to run (the first is the baseline; use 1)")->delimiter(',');
  cli.add_option("--updates", o.updates, "requests per application")->check(CLI::PositiveNumber);
  cli.add_option("--reps", o.reps, "repetitions per application count")->check(CLI::PositiveNumber);
  cli.add_option("--window", o.window, "requests an application keeps unanswered at most")->check(CLI::PositiveNumber);
  cli.add_option("--client-spin-us", o.client_spin_us,
                 "AttachOptions::spin: how long an app spins for an answer before sleeping (0: sleep at once)")
      ->capture_default_str();
  cli.add_option("--policy", o.policy, "gradlaned --policy")->check(CLI::IsMember({"scheduler", "passthrough"}));
  cli.add_option("--staleness-bound", o.staleness_bound, "gradlaned --staleness-bound (0: unbounded)")
      ->capture_default_str();
  cli.add_option("--gradlaned", o.gradlaned, "the gradlaned binary")->capture_default_str();
  cli.add_option("--pin-daemon", o.pin_daemon, "run gradlaned on this CPU alone and the apps on the other CPUs")
      ->check(CLI::NonNegativeNumber);
  cli.add_flag("--hostile", o.hostile,
               "also run every repetition with one hostile app of another job (largest updates, never completed, "
               "asked again past every refusal), and with that app waking as often but asking for nothing (the "
               "control), and compare the other apps' request latency");
  cli.add_option("--hostile-refill-us", o.hostile_refill_us,
                 "the hostile app sleeps this long between two refills of its request queue")
      ->capture_default_str();
  CLI11_PARSE(cli, argc, argv);
  if (o.hostile) return hostile_comparison(o);

  std::optional<double> baseline;  // median total requests/s of the first (1-app) count
  fmt::print(
      "| apps | requests/s total | requests/s per app | share ratio, slowest app | per app / 1 app alone, "
      "slowest app | go / dropped per rep | gradlaned CPU (cores) | requests per gradlaned CPU-s | gradlaned peak RSS "
      "(MiB) |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const std::uint32_t apps : o.apps) {
    std::vector<double> totals, per_app, min_ratio, min_alone, rss, cpu, per_cpu;
    std::uint64_t go = 0, dropped = 0;
    for (std::uint32_t rep = 0; rep < o.reps; ++rep) {
      const RepResult r = run_rep(apps, o, static_cast<int>(rep), Neighbour::none);
      totals.push_back(r.total_per_s);
      per_app.insert(per_app.end(), r.app_per_s.begin(), r.app_per_s.end());
      if (baseline) {
        const double slowest = *std::min_element(r.app_per_s.begin(), r.app_per_s.end());
        min_ratio.push_back(slowest / (*baseline / apps));
        min_alone.push_back(slowest / *baseline);
      }
      rss.push_back(static_cast<double>(r.peak_rss_kib) / 1024.0);
      cpu.push_back(r.daemon_cpu_share);
      per_cpu.push_back(r.per_daemon_cpu_s);
      go += r.go;
      dropped += r.dropped;
    }
    const std::string ratio = baseline ? spread(min_ratio, "{:.2f}") : std::string("(baseline)");
    const std::string alone = baseline ? spread(min_alone, "{:.2f}") : std::string("1");
    fmt::print("| {} | {} | {} | {} | {} | {} / {} | {} | {} | {} |\n", apps, spread(totals, "{:.0f}"),
               spread(per_app, "{:.0f}"), ratio, alone, go / o.reps, dropped / o.reps, spread(cpu, "{:.2f}"),
               spread(per_cpu, "{:.0f}"), spread(rss, "{:.1f}"));
    if (!baseline) {
      std::sort(totals.begin(), totals.end());
      baseline = totals[totals.size() / 2];
    }
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "gradlane_sidecar_load: {}\n", e.what());
  return 1;
}
