// gradlaned: the per-host scheduling sidecar. Parses flags, creates the segment, runs the
// loop until SIGTERM/SIGINT, then unlinks the segment (Daemon's destructor).
//
// Without --foreground it detaches into the background, but only once the segment exists:
// the parent waits for the child's "ready" and exits with its status, so
// `gradlaned && ./train` never races the attach. Logs go to stderr in both modes. With
// --pid-file the pid is written before "ready" (so it is there when the parent returns) and
// the file is removed on a clean exit. Under systemd (sidecar/daemon/gradlaned.service) it
// runs in the foreground and says READY=1 at the same moment, through sd_notify.
#include <chrono>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <systemd/sd-daemon.h>

#include "common/syscall_error.hpp"
#include "common/unique_fd.hpp"
#include "gradlane/error.hpp"
#include "gradlane/metrics.hpp"
#include "sidecar/core/policy.hpp"
#include "sidecar/daemon/daemon.hpp"
#include "sidecar/daemon/daemon_metrics.hpp"
#include "sidecar/daemon/endpoint_claim.hpp"
#include "sidecar/daemon/pid_file.hpp"
#include "sidecar/daemon/signals.hpp"
#include "sidecar/peer/fabric.hpp"

namespace {

using gradlane::sidecar::Daemon;
using gradlane::sidecar::DaemonConfig;
using gradlane::sidecar::parse_job_user;
using gradlane::sidecar::parse_standby;
using gradlane::sidecar::UniqueFd;

// A line on stderr that a closed or full stderr cannot turn into an exception (SIGPIPE is
// ignored at the top of main): the daemon outlives its log.
template <typename... Args>
void say(fmt::format_string<Args...> format, Args&&... args) noexcept {
  try {
    const std::string line = "gradlaned: " + fmt::format(format, std::forward<Args>(args)...) + "\n";
    if (std::fwrite(line.data(), 1, line.size(), stderr) != line.size()) std::clearerr(stderr);
  } catch (...) {
    // Formatting failed (out of memory): nothing to say it with.
  }
}

// Forks; the parent waits until the child reports the segment ready (one byte on a pipe) and
// exits 0, or exits 1 if the child failed before that. Returns the write end in the child.
UniqueFd detach_into_background() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) gradlane::detail::throw_call_failed(gradlane::Errc::system, "pipe2", errno);
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  const pid_t child = ::fork();
  if (child < 0) gradlane::detail::throw_call_failed(gradlane::Errc::system, "fork", errno);
  if (child > 0) {
    write_end.reset();
    char ready = 0;
    ::_exit(::read(read_end.get(), &ready, 1) == 1 ? 0 : 1);
  }
  ::setsid();  // no controlling terminal: a closed shell does not SIGHUP the daemon
  if (::chdir("/") != 0) {
    // Not fatal: the daemon opens no relative paths.
  }
  UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (devnull) ::dup2(devnull.get(), STDIN_FILENO);
  return write_end;
}

// --aggregator JOB:ENDPOINT
gradlane::sched::AggregationConfig::Seat parse_aggregator(const std::string& text) {
  const auto colon = text.find(':');
  const auto number = [&](std::string_view part) -> std::optional<std::uint32_t> {
    std::uint32_t value = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (ec != std::errc{} || end != part.data() + part.size() || part.empty()) return std::nullopt;
    return value;
  };
  const std::string_view all(text);
  const auto job = colon == std::string::npos ? std::nullopt : number(all.substr(0, colon));
  const auto endpoint = colon == std::string::npos ? std::nullopt : number(all.substr(colon + 1));
  if (!job || !endpoint) {
    throw gradlane::Error(gradlane::Errc::invalid_argument,
                          fmt::format("--aggregator '{}': expected JOB:ENDPOINT, two numbers (e.g. 1:4)", text));
  }
  return {gradlane::sched::JobId{*job}, gradlane::sched::EndpointId{*endpoint}};
}

// --link-rate ENDPOINT:in|out:RATE, RATE in tc's units: 4mbit, 25gbit, 500kbit, 1000bit.
gradlane::sched::BandwidthConfig::Declared parse_link_rate(const std::string& text) {
  const auto bad = [&] {
    return gradlane::Error(
        gradlane::Errc::invalid_argument,
        fmt::format("--link-rate '{}': expected ENDPOINT:in|out:RATE, e.g. 0:in:4mbit or 3:out:25gbit", text));
  };
  const auto first = text.find(':');
  const auto second = first == std::string::npos ? std::string::npos : text.find(':', first + 1);
  if (second == std::string::npos) throw bad();
  std::uint32_t endpoint = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + first, endpoint);
  if (ec != std::errc{} || end != text.data() + first || first == 0) throw bad();
  const std::string direction = text.substr(first + 1, second - first - 1);
  if (direction != "in" && direction != "out") throw bad();
  const std::string rate = text.substr(second + 1);
  std::size_t digits = 0;
  double value = 0;
  try {
    value = std::stod(rate, &digits);
  } catch (const std::exception&) {
    throw bad();
  }
  const std::string unit = rate.substr(digits);
  double bits = 0;
  if (unit == "bit")
    bits = value;
  else if (unit == "kbit")
    bits = value * 1e3;
  else if (unit == "mbit")
    bits = value * 1e6;
  else if (unit == "gbit")
    bits = value * 1e9;
  else
    throw bad();
  if (!(bits > 0)) throw bad();
  return {gradlane::sched::EndpointId{endpoint},
          direction == "in" ? gradlane::sched::Direction::ingress : gradlane::sched::Direction::egress, bits / 8};
}

std::unique_ptr<gradlane::sched::Policy> make_policy(const std::string& name, gradlane::peer::Fabric& fabric,
                                                     const gradlane::sched::SchedulerConfig& config) {
  if (name == "passthrough") return std::make_unique<gradlane::sched::PassThroughPolicy>();
  return fabric.make_policy(config);
}

// ", job 7's own for uid 1001, ..." for the serving line (its apps get it from the door).
std::string job_segments_said(const DaemonConfig& config) {
  std::string said;
  for (const auto& j : config.job_segments) {
    said += fmt::format(", job {}'s own for uid {}", j.job, j.uid);
  }
  return said;
}

// CLI11's dump of every option, made a file --config reads back: an empty list, which CLI11
// writes as "[]" and a list option then refuses, becomes a comment, and --check-config itself
// (with its description) is left out, or the file would only ever check.
std::string as_config_file(const std::string& dump) {
  std::vector<std::string> lines;
  std::istringstream in(dump);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("check-config=")) {  // and the description and blank line before it
      if (!lines.empty() && lines.back().starts_with("#")) lines.pop_back();
      if (!lines.empty() && lines.back().empty()) lines.pop_back();
      continue;
    }
    if (line.ends_with("=\"[]\"")) line = "# " + line.substr(0, line.size() - 4) + "[]  (none given)";
    lines.push_back(line);
  }
  std::string file;
  for (const std::string& line : lines) file += line + "\n";
  return file;
}

// SchedulerConfig::validate() names the config's fields; the operator set them by these flags.
std::string in_flag_terms(std::string problem) {
  constexpr std::pair<std::string_view, std::string_view> kFlags[] = {
      {"job_sharing", "--job-sharing"},
      {"job_priority", "--job-priority"},
      {"aggregation.relay_ratio", "--relay-slower-than"}};
  for (const auto& [field, flag] : kFlags) {
    for (std::size_t at = problem.find(field); at != std::string::npos; at = problem.find(field, at + flag.size())) {
      problem.replace(at, field.size(), flag);
    }
  }
  return problem;
}

}  // namespace

int main(int argc, char** argv) {
  // First of all: a log whose reader went away (a closed pipe) must not kill the daemon; a
  // failed write is an error return, which say() ignores.
  ::signal(SIGPIPE, SIG_IGN);
  const auto started = std::chrono::steady_clock::now();  // for the "serving" line: how long start-up took
  CLI::App cli{
      "gradlaned: the gradlane scheduling sidecar (one per host). Applications attach "
      "through a shared-memory segment and are told when each gradient update may use "
      "the network."};
  // Every option's default is shown by --help and written by --check-config.
  cli.option_defaults()->always_capture_default();
  cli.set_config("--config", "",
                 "read options from this TOML file: `name = value` lines, names as the long options without '--' "
                 "(endpoint = [0, 2], listen-port = 7600, key-file = \"/etc/gradlane/cluster.key\"); options given on "
                 "the command line win; an unknown name is an error");
  cli.allow_config_extras(CLI::config_extras_mode::error);  // a misspelt name must not be ignored
  bool check_config = false;
  cli.add_flag(
      "--check-config", check_config,
      "check the options (the --config file and the command line: values, bounds, the key) and print them "
      "all, defaults included, as a --config file; exit 0 without starting, or non-zero naming the first problem");
  DaemonConfig config;
  bool foreground = false;
  std::string pid_file;
  std::string policy = "scheduler";
  std::uint64_t idle_spin_us =
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(config.idle_spin).count());
  cli.add_option("--shm-name", config.shm_name, "shared-memory segment applications attach to (GRADLANE_SIDECAR_SHM)")
      ->capture_default_str();
  cli.add_option("--max-apps", config.max_apps, "application slots (each ~33 KiB of shared memory)")
      ->capture_default_str();
  cli.add_option("--max-update-bytes", config.max_update_bytes,
                 "largest gradient a request may name; larger is refused as malformed")
      ->capture_default_str();
  cli.add_option("--max-outstanding", config.max_outstanding,
                 "requests one application may have unanswered or granted-but-not-completed")
      ->capture_default_str();
  cli.add_option("--max-owed-bytes", config.max_owed_bytes,
                 "bytes one application may have requested and not yet had decided and completed (each request is "
                 "queued as 4 MiB parts in the loop that serves every job); beyond it requests are refused as "
                 "too_many_outstanding");
  cli.add_option("--idle-spin-us", idle_spin_us,
                 "poll this long after the last work before sleeping (0: sleep at once, lowest CPU)")
      ->capture_default_str();
  cli.add_option("--policy", policy,
                 "scheduler (the gradlane scheduling core) or passthrough "
                 "(grant everything at once: for measuring the queues only)")
      ->check(CLI::IsMember({"scheduler", "passthrough"}))
      ->capture_default_str();
  gradlane::peer::FabricOptions fabric_options;
  gradlane::sched::SchedulerConfig sched_config;
  // Without a replica nothing acknowledges sequence numbers, so the bound B is off by default.
  sched_config.replica_bound.reset();
  std::uint32_t staleness_bound = sched_config.staleness_bound.value_or(0);
  std::uint64_t replica_bound = 0;
  std::vector<std::string> standbys;
  cli.add_option("--device", fabric_options.device, "RDMA device for links to peer sidecars (e.g. mlx5_0)");
  cli.add_option("--endpoint", fabric_options.endpoints,
                 "scheduler endpoint id of a NIC on this host (repeat for several). Applications may attach only "
                 "from these; requests to receivers on these are scheduled here, to others by the peer that "
                 "announces them, and to a receiver no sidecar serves are refused (unknown_receiver). Without "
                 "any --endpoint (and no peers) every endpoint is accepted and scheduled here");
  cli.add_option("--standby", standbys,
                 "ENDPOINT:JOB, a server's endpoint id and the job whose replica of it runs on this host "
                 "(repeatable): if that replica is promoted (the server died), this sidecar takes over the server's "
                 "sequence and tells its peers; an app of another job may not");
  cli.add_option("--listen-port", fabric_options.listen_port, "port peer sidecars connect to")->capture_default_str();
  cli.add_option("--peer", fabric_options.peers, "ADDRESS:PORT of a peer sidecar to connect to (repeatable)");
  cli.add_option("--expect-peers", fabric_options.expect_peers, "peer sidecars that connect to this one")
      ->capture_default_str();
  cli.add_option("--link-rate-gbps", fabric_options.link_rate_gbps,
                 "NIC rate to assume until transfers are measured (0: the core's default, 100 Gb/s)")
      ->capture_default_str();
  cli.add_option("--schedule-log", fabric_options.schedule_log,
                 "write every scheduling decision and completion as a JSON line to FILE ('-' = stderr); FILE is "
                 "truncated at start, so it holds this run only");
  cli.add_option("--staleness-bound", staleness_bound,
                 "tau: largest delay (in versions) an applied update may have; 0 = unbounded")
      ->capture_default_str();
  cli.add_option("--replica-bound", replica_bound,
                 "B: sequence numbers may run at most this far ahead of the replica's ack; 0 = no replica. A "
                 "server app that declares its slots (AttachOptions::slots, as ps::ShardServer does) is held to "
                 "min(B, slots) ahead of what it applied, with or without a replica")
      ->capture_default_str();
  std::string ingress_sharing = "exclusive";
  cli.add_option("--ingress-sharing", ingress_sharing,
                 "exclusive: a server's ingress carries one granted transfer at a time, at its sender's rate; packed: "
                 "grants run side by side, each booked at the share of the server's line rate its sender can use, so "
                 "a slow sender never idles the rest of the server (give the server's rate with --link-rate)")
      ->check(CLI::IsMember({"exclusive", "packed"}))
      ->capture_default_str();
  std::string job_sharing = "shortest-remaining";
  cli.add_option("--job-sharing", job_sharing,
                 "how a host NIC is shared between the jobs queued on it: shortest-remaining (the job with the least "
                 "work left first, each backlogged job keeping a 10% floor), or a baseline to compare it with: fair "
                 "(equal bytes to every backlogged job) or priority (strict, in --job-priority's order)")
      ->check(CLI::IsMember({"shortest-remaining", "fair", "priority"}))
      ->capture_default_str();
  std::vector<std::uint32_t> job_priority;
  cli.add_option("--job-priority", job_priority,
                 "JOB,JOB,... for --job-sharing priority: the jobs in the order they are served (jobs not listed "
                 "come after them, lower id first)")
      ->delimiter(',');
  cli.add_flag("--writers-mirror", sched_config.writers_mirror,
               "the servers' writers also write each update to the replica at the same time (ps::Worker's "
               "default with a replica): their slots are sized for twice the bytes on their side. Leave it off "
               "when the replica READs updates from the server");
  std::vector<std::string> aggregators;
  cli.add_option("--aggregator", aggregators,
                 "JOB:ENDPOINT: that endpoint may sum updates of that job (repeatable). The scheduler then redirects "
                 "updates that would wait for a busy server to an app of the job attached from that endpoint (a "
                 "ps::Aggregator in sidecar mode), which forwards their sum as one update. Give it to the sidecar "
                 "that owns the servers' endpoints");
  cli.add_flag("--aggregate-eagerly", sched_config.aggregation.pick_joins,
               "let the update about to be granted join the updates waiting behind it in a group for an "
               "aggregator, when that beats sending it to the server (pays when the workers' links are much "
               "faster than the server's ingress)");
  cli.add_option("--relay-slower-than", sched_config.aggregation.relay_ratio,
                 "with --aggregate-eagerly: an update about to be granted goes alone through an aggregator when its "
                 "transfer straight to the server would hold the server's ingress at least this many times longer "
                 "than the aggregator's forward (a straggler's update); 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  std::vector<std::string> link_rates;
  cli.add_option("--link-rate", link_rates,
                 "ENDPOINT:in|out:RATE (tc units: 4mbit, 25gbit): a rate known before any transfer, e.g. a server "
                 "NIC narrower than the workers' (repeatable). Estimates are still learned from transfers; a side "
                 "known to carry its rate is not blamed for a straggler's slow transfer through it");
  std::vector<std::string> job_users;
  cli.add_option("--job-user", job_users,
                 "JOB:USER: job JOB gets a shared-memory segment of its own that only USER's processes (a name or "
                 "a uid; and root's) get, from gradlaned's door (a Unix socket that checks who asks), so only they "
                 "can attach as JOB or see its queues; it is sealed, so no holder can resize it under gradlaned "
                 "(repeatable). Other jobs share --shm-name");
  cli.add_flag("--foreground", foreground, "stay in the foreground (default: detach once the segment is ready)");
  cli.add_option("--pid-file", pid_file,
                 "write the daemon's pid to FILE once the segment is ready and remove it on a clean exit; FILE "
                 "stays locked while it runs, so a second gradlaned with the same FILE fails naming the pid");
  std::string key_file;
  bool insecure = false;
  cli.add_option("--key-file", key_file,
                 "file (mode 0600) holding the cluster's key, which peer sidecars must present to link with this "
                 "one (GRADLANE_JOB_KEY_FILE); gradlaned refuses to start without a key unless --insecure");
  cli.add_flag("--insecure", insecure,
               "run without a key (GRADLANE_INSECURE=1): any process that reaches --listen-port can link as a peer");
  std::string metrics_at;
  cli.add_option("--metrics", metrics_at,
                 "ADDRESS:PORT to serve Prometheus metrics on (GET /metrics): decisions, drops by reason, grant "
                 "staleness, each sender's push time and straggler score, apps");
  CLI11_PARSE(cli, argc, argv);
  config.idle_spin = std::chrono::microseconds(idle_spin_us);
  if (staleness_bound == 0) {
    sched_config.staleness_bound.reset();
  } else {
    sched_config.staleness_bound = staleness_bound;
  }
  if (replica_bound > 0) sched_config.replica_bound = replica_bound;
  sched_config.ingress = ingress_sharing == "packed" ? gradlane::sched::IngressSharing::packed
                                                     : gradlane::sched::IngressSharing::exclusive;
  sched_config.job_sharing = job_sharing == "fair"       ? gradlane::sched::JobSharing::fair
                             : job_sharing == "priority" ? gradlane::sched::JobSharing::priority
                                                         : gradlane::sched::JobSharing::shortest_remaining;
  for (const std::uint32_t job : job_priority) sched_config.job_priority.push_back(gradlane::sched::JobId{job});
  config.endpoints = fabric_options.endpoints;
  fabric_options.peer_request_bytes = config.max_update_bytes;
  // Saturating: a product past 2^64 means no bound worth the name.
  fabric_options.peer_pending_bytes = config.max_owed_bytes > UINT64_MAX / std::max<std::uint64_t>(config.max_apps, 1)
                                          ? UINT64_MAX
                                          : config.max_owed_bytes * config.max_apps;

  try {
    for (const std::string& seat : aggregators) sched_config.aggregation.aggregators.push_back(parse_aggregator(seat));
    for (const std::string& rate : link_rates) sched_config.bandwidth.declared.push_back(parse_link_rate(rate));
    for (const std::string& job : job_users) config.job_segments.push_back(parse_job_user(job));
    for (const std::string& standby : standbys) config.standby.push_back(parse_standby(standby));
    // The flags stand in for their variables; the one parser checks the key file and refuses to
    // run without a key.
    fabric_options.transport =
        gradlane::TransportOptions::from_env([&](const char* name) -> std::optional<std::string> {
          const std::string_view variable(name);
          if (variable == "GRADLANE_JOB_KEY_FILE" && !key_file.empty()) return key_file;
          if (variable == "GRADLANE_INSECURE" && insecure) return "1";
          if (const char* value = std::getenv(name)) return std::string(value);
          return std::nullopt;
        });
    config.validate();
    if (auto problem = sched_config.validate()) {
      throw gradlane::Error(gradlane::Errc::invalid_argument, in_flag_terms(*problem));
    }
    if (check_config) {
      fmt::print("# gradlaned options, checked: every one with its value (defaults included)\n{}",
                 as_config_file(cli.config_to_str(true, true)));
      return 0;
    }
    UniqueFd ready;
    if (!foreground) ready = detach_into_background();
    // Locked before anything is set up (a second gradlaned on the same file stops here, naming
    // the first one's pid), written once the segment is ready; in the child when detached,
    // since the lock belongs to the process that keeps running.
    std::optional<gradlane::sidecar::PidFile> pid;
    if (!pid_file.empty()) pid.emplace(gradlane::sidecar::PidFile::acquire(pid_file));
    // Before any thread exists, so every thread inherits the blocked mask.
    gradlane::sidecar::DaemonSignals signals;
    const auto claims = gradlane::sidecar::EndpointClaims::acquire(config.endpoints);
    // Peer links first: a request must not be scheduled before we know which receivers are remote.
    gradlane::peer::Fabric fabric(fabric_options, [](const std::string& line) { say("{}", line); });
    Daemon daemon(config, make_policy(policy, fabric, sched_config));
    // After the detach: the exporter's thread must belong to the process that keeps running.
    std::optional<gradlane::metrics::Exporter> exporter;
    const auto metrics = std::make_shared<gradlane::sidecar::DaemonMetrics>();
    if (!metrics_at.empty()) {
      exporter.emplace(metrics_at);
      exporter->add(metrics);
      say("metrics on http://{}:{}/metrics", metrics_at.substr(0, metrics_at.rfind(':')), exporter->port());
    }
    if (pid) pid->publish(::getpid());
    say("serving {}{} for up to {} applications each (pid {}, generation {:#x}, policy {}, {}; ready {} ms after "
        "start)",
        config.shm_name, job_segments_said(config), config.max_apps, ::getpid(), daemon.generation(), policy,
        config.endpoints.empty() ? std::string("every endpoint")
                                 : fmt::format("endpoints {}", fmt::join(config.endpoints, ",")),
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count());
    // Outside systemd (no NOTIFY_SOCKET) a no-op; MAINPID for a detached child.
    ::sd_notifyf(0, "READY=1\nMAINPID=%d", static_cast<int>(::getpid()));
    if (ready) {
      const char byte = 1;
      if (::write(ready.get(), &byte, 1) != 1) {
        // The parent is gone; nothing to tell.
      }
      ready.reset();
    }
    daemon.run([&] {
      if (exporter) metrics->update(daemon);
      if (signals.take_hangup()) {
        if (const auto failed = fabric.reopen_schedule_log()) say("SIGHUP: {}", *failed);
      }
      return signals.received().has_value();
    });
    ::sd_notify(0, "STOPPING=1");
    const auto& s = daemon.stats();
    say("signal {} received, stopping ({} attaches, {} dead apps reclaimed, {} requests, {} answers of which {} "
        "errors)",
        signals.received().value_or(0), s.attached, s.reclaimed, s.submitted, s.answers, s.errors);
    return 0;
  } catch (const std::exception& e) {
    say("{}", e.what());
    return 1;
  }
}
