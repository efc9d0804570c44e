// gradlane_ps_push_bw: the parameter server's push throughput (docs/results.md), measured
// the way perftest measures write_bw and printed in its columns, so the two sit side by side.
//
//   gradlane_ps_push_bw --role replica -d rxe1 --port 7901 --workers 1 -n 64
//   gradlane_ps_push_bw --role server  -d rxe0 --port 7900 --workers 1 -n 64 [--replica ADDR:7901]
//   gradlane_ps_push_bw --role worker  -d rxe2 --server ADDR:7900 [--replica ADDR:7901] -n 64
//
// The worker pushes -n updates of -s bytes through ps::Worker::push (request → grant → WRITE +
// doorbell to the replica and the server → both completions), one after another as a training
// loop does. BW average = update bytes × n / (first request → last completion); the egress
// figure counts what the worker really sent (× 2 with a replica). Each push is split into its
// grant wait (request → grant) and its wire time (first post → last completion), which is
// where a throughput gap shows its cause. The server and the replica run a ShardServer of
// bytes/4 floats, apply every update (SGD step) and exit when all workers × n are applied;
// the server reports applies/s. Only the public API is used: what an embedder gets.
#include <gradlane/gradlane.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace ps = gradlane::ps;

constexpr const char* kName = "gradlane_ps_push_bw";
constexpr double kBytesPerMB = 1048576.0;    // perftest's MB/sec (0x100000)
constexpr double kBytesPerGb = 125000000.0;  // perftest's Gb/sec (10^9 bits)

struct Options {
  std::string role;
  std::string device;
  int gid_index = -1;
  std::uint16_t port = 7900;
  std::optional<ps::Endpoint> server, replica;
  std::uint64_t bytes = 4ULL << 20;
  std::uint64_t iterations = 64;
  std::size_t workers = 1;
  std::uint32_t id = 1;
  std::uint32_t slots = 8;
  int timeout_s = 60;
  int idle_nap_us = 1000;
  bool replica_reads = false;  // worker: no mirror; replica: reads each update from the server
  bool grant_windows = false;  // server: a memory window per grant over its slot (ShardOptions)
  // Sidecar mode: the host's gradlaned (this shm name) grants, job 1; `endpoint` is this app's
  // NIC and `server_endpoint` the server's (worker).
  std::string sidecar;
  std::uint32_t endpoint = 0, server_endpoint = 0;
  std::string out_json;
};

// "ADDR:PORT" → Endpoint, or a message that names the flag.
ps::Endpoint parse_endpoint(const std::string& flag, const std::string& text) {
  try {
    return ps::Endpoint::parse(text);
  } catch (const gradlane::Error& e) {
    throw CLI::ValidationError(flag, e.what());
  }
}

// Returns the options, or an exit code (0 after --help, 1 for a bad flag: one line on stderr).
std::variant<Options, int> parse(int argc, char** argv) {
  Options o;
  std::string server, replica;
  CLI::App app{
      "Parameter-server push throughput over gradlane (ps::Worker::push into a ShardServer), "
      "in perftest's columns."};
  app.get_formatter()->column_width(30);
  app.add_option("--role", o.role, "server | replica | worker")
      ->required()
      ->check(CLI::IsMember({"server", "replica", "worker"}));
  app.add_option("-d,--ib-dev", o.device, "RDMA device (default: the only device)");
  app.add_option("-x,--gid-index", o.gid_index, "GID index (default: the first RoCE v2 IPv4 GID)")
      ->check(CLI::Range(0, 255));
  app.add_option("-p,--port", o.port, "rdma_cm port to listen on (server, replica)")->check(CLI::Range(1, 65535));
  app.add_option("--server", server, "the server, ADDR:PORT (worker)");
  app.add_option("--replica", replica, "the replica, ADDR:PORT (server: connect to it; worker: mirror to it)");
  app.add_option("-s,--size", o.bytes, "update size in bytes, a multiple of 4 (the shard is size/4 floats)")
      ->check(CLI::Range(std::uint64_t{4}, std::uint64_t{1} << 30));
  app.add_option("-n,--iters", o.iterations, "updates per worker")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 32));
  app.add_option("--workers", o.workers, "workers to accept (server, replica)")->check(CLI::Range(1, 256));
  app.add_option("--id", o.id, "this worker's id, unique per shard, > 0 (worker)")->check(CLI::Range(1U, 1U << 30));
  app.add_option("--slots", o.slots, "update slots in the shard's ring (server, replica)")
      ->check(CLI::Range(1U, 1024U));
  app.add_option("--timeout", o.timeout_s, "seconds: bound on connect/accept and on any wait without progress")
      ->check(CLI::Range(1, 86400));
  app.add_option("--idle_nap_us", o.idle_nap_us,
                 "server/replica: after 256 idle rounds nap 20 µs, doubling up to this (0 = spin, as run_until)")
      ->check(CLI::Range(0, 100000));
  app.add_flag("--replica_reads", o.replica_reads,
               "worker: write each update to the server only; replica: read each one from the server's slot "
               "(give it to both)");
  app.add_flag("--grant_windows", o.grant_windows,
               "server: each grant binds a memory window over its slot alone (ShardOptions::grant_windows)");
  app.add_option("--sidecar", o.sidecar,
                 "sidecar mode: the gradlaned serving this shared-memory name grants every update (job 1)");
  app.add_option("--endpoint", o.endpoint, "sidecar mode: this app's endpoint id (the server's: its receiver id)");
  app.add_option("--server_endpoint", o.server_endpoint, "sidecar mode, worker: the server's endpoint id");
  app.add_option("--out_json", o.out_json, "also write the results as JSON to this file");
  try {
    app.parse(argc, argv);
    if (o.bytes % sizeof(float) != 0)
      throw CLI::ValidationError("-s", fmt::format("{} is not a multiple of 4", o.bytes));
    if (!server.empty()) o.server = parse_endpoint("--server", server);
    if (!replica.empty()) o.replica = parse_endpoint("--replica", replica);
    if (o.role == "worker" && !o.server) throw CLI::RequiredError("--server (the worker needs the server's ADDR:PORT)");
    if (o.role == "replica" && o.replica)
      throw CLI::ValidationError("--replica", "a replica has no replica of its own");
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", kName, e.what());
    return 1;
  }
  return o;
}

gradlane::sidecar::AttachOptions sidecar_attach(const Options& o) {
  auto attach = gradlane::sidecar::AttachOptions::from_env();
  attach.shm_name = o.sidecar;
  attach.job = 1;
  attach.endpoint = o.endpoint;
  return attach;
}

gradlane::Device open_device(const Options& o) {
  return gradlane::Device::open({.name = o.device, .gid_index = o.gid_index});
}

void header(const Options& o, const gradlane::DeviceInfo& info) {
  const std::string dashes(79, '-');
  std::cout << dashes << '\n'
            << "                    Parameter-server push (ps::Worker::push), role " << o.role << '\n'
            << " Device         : " << info.name << "\n Link type      : " << info.link_layer
            << "\n Mtu            : " << info.active_mtu << "[B]\n GID index      : " << info.gid_index << " ("
            << info.gid_type << ", " << info.ipv4_address << ")\n Update size    : " << o.bytes << "[B] ("
            << o.bytes / sizeof(float) << " floats)\n"
            << dashes << '\n'
            << std::flush;
}

void write_json(const std::string& path, const nlohmann::json& document) {
  if (path.empty()) return;
  std::ofstream out(path, std::ios::trunc);
  out << document.dump(2) << '\n';
  if (!out) throw gradlane::Error(gradlane::Errc::system, fmt::format("cannot write the JSON report to '{}'", path));
}

struct Summary {
  double avg = 0, median = 0, min = 0, max = 0;
};

Summary summarise(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const double sum = std::accumulate(v.begin(), v.end(), 0.0);
  const std::size_t n = v.size();
  const double median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {sum / static_cast<double>(n), median, v.front(), v.back()};
}

nlohmann::json to_json(const Summary& s) {
  return {{"avg", s.avg}, {"median", s.median}, {"min", s.min}, {"max", s.max}};
}

// ---- server and replica ----

int run_shard(const Options& o) {
  const ps::Role role = o.role == "server" ? ps::Role::server : ps::Role::replica;
  const auto timeout = std::chrono::duration_cast<gradlane::Millis>(std::chrono::seconds(o.timeout_s));
  // The shard (+ a header page) and the slot ring are pinned.
  gradlane::check_memlock(o.bytes * (o.slots + 1) + 2 * 4096);
  gradlane::Device device = open_device(o);
  header(o, device.info());
  ps::ShardOptions shard_options;
  shard_options.floats = o.bytes / sizeof(float);
  shard_options.slots = o.slots;
  shard_options.transport = gradlane::TransportOptions::from_env();
  shard_options.read_updates_from_server = o.replica_reads;
  shard_options.grant_windows = o.grant_windows;  // the replica's too: mirrors claim their slots
  if (!o.sidecar.empty() && role == ps::Role::server) shard_options.sidecar = sidecar_attach(o);
  const std::vector<float> initial(shard_options.floats, 0.0F);
  ps::ShardServer shard(device, role, o.port, shard_options, initial);
  std::cout << " " << o.role << " listening on port " << shard.port() << ", expecting " << o.workers << " worker(s) × "
            << o.iterations << " updates\n"
            << std::flush;
  if (role == ps::Role::server && o.replica) shard.connect_replica(o.replica->address, o.replica->port, timeout);
  shard.accept_peers(o.workers, timeout);

  const std::uint64_t total = o.workers * o.iterations;
  const auto& st = shard.stats();
  std::optional<Clock::time_point> first_grant, first_apply;
  Clock::time_point last_apply{}, last_work = Clock::now();
  std::uint64_t seen_applied = 0;
  std::uint32_t idle = 0;
  // Like run_until, but naps when idle (a spinning server takes a vCPU from rxe, as the
  // write_bw server's nap showed: 20 µs doubling up to --idle_nap_us, back to 20 µs on work)
  // and stamps the first grant and every apply.
  const auto max_nap = std::chrono::microseconds(std::max(o.idle_nap_us, 1));
  auto nap = std::min(std::chrono::microseconds(20), max_nap);
  std::vector<double> apply_us;  // progress() calls that applied: the apply's cost (SGD step)
  apply_us.reserve(total);
  auto step = [&] {
    const auto before = Clock::now();
    if (shard.progress() != 0) {
      idle = 0;
      nap = std::min(std::chrono::microseconds(20), max_nap);
      const auto now = Clock::now();
      last_work = now;
      // Sidecar mode: the sidecar grants; the first claim (grant windows) or apply stands in.
      if (!first_grant && (st.granted > 0 || st.claimed > 0 || st.applied > 0)) first_grant = now;
      if (st.applied != seen_applied) {
        if (!first_apply) first_apply = now;
        apply_us.push_back(std::chrono::duration<double, std::micro>(now - before).count() /
                           static_cast<double>(st.applied - seen_applied));
        seen_applied = st.applied;
        last_apply = now;
      }
      return;
    }
    ++idle;
    if (o.idle_nap_us > 0 && idle > 256) {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, max_nap);
    }
    if (idle % 64 == 0 && Clock::now() - last_work > timeout) {
      throw gradlane::Error(gradlane::Errc::timeout,
                            fmt::format("{}: no progress for {} s with {} of {} updates applied ({} skipped): is the "
                                        "worker still running?",
                                        o.role, o.timeout_s, st.applied, total, st.skipped));
    }
  };
  while (st.applied + st.skipped < total && !shard.finished()) step();
  // Before the stats, so they show what the replica acknowledged.
  if (!shard.drain_replica(timeout)) {
    throw gradlane::Error(gradlane::Errc::timeout,
                          fmt::format("{}: the replica acknowledged {} of {} decisions within {} s", o.role,
                                      st.replica_acked, st.applied + st.skipped, o.timeout_s));
  }

  const std::uint64_t applied = st.applied;
  // The replica's clock starts at its first apply (it never grants); the server's at its
  // first grant, i.e. the first update's request.
  const std::optional<Clock::time_point> start = role == ps::Role::server ? first_grant : first_apply;
  const double seconds = start ? std::chrono::duration<double>(last_apply - *start).count() : 0.0;
  const std::uint64_t counted = role == ps::Role::server ? applied : (applied > 0 ? applied - 1 : 0);
  const double rate = seconds > 0 ? static_cast<double>(counted) / seconds : 0.0;
  const double mbps = rate * static_cast<double>(o.bytes) / kBytesPerMB;
  const Summary apply = summarise(apply_us);
  std::cout << " #bytes     #applied    #skipped    applies/s      applied BW[MB/sec]   seconds    "
               "t_apply avg/med/max[usec]\n"
            << fmt::format(" {:<10} {:<11} {:<11} {:<14.2f} {:<20.2f} {:<10.3f} {:.1f} {:.1f} {:.1f}\n", o.bytes,
                           applied, st.skipped, rate, mbps, seconds, apply.avg, apply.median, apply.max)
            << fmt::format(
                   " granted {}, claimed {}, refused doorbells {}, peers lost {}, left {}, replica acked {}, "
                   "mirrors fetched {}\n",
                   st.granted, st.claimed, st.refused_doorbells, st.peers_lost, st.peers_left, st.replica_acked,
                   st.mirrors_fetched)
            << std::string(79, '-') << '\n'
            << std::flush;
  write_json(o.out_json, {{"test_info",
                           {{"tool", kName},
                            {"role", o.role},
                            {"device", device.info().name},
                            {"bytes", o.bytes},
                            {"workers", o.workers},
                            {"iterations", o.iterations},
                            {"slots", o.slots},
                            {"replica", o.replica ? fmt::format("{}:{}", o.replica->address, o.replica->port) : ""},
                            {"idle_nap_us", o.idle_nap_us}}},
                          {"results",
                           {{"MsgSize", o.bytes},
                            {"applied", applied},
                            {"skipped", st.skipped},
                            {"granted", st.granted},
                            {"applies_per_s", rate},
                            {"bw_avg", mbps},
                            {"bw_unit", "MB/sec"},
                            {"seconds", seconds},
                            {"t_apply_us", to_json(apply)},
                            {"peers_lost", st.peers_lost},
                            {"refused_doorbells", st.refused_doorbells},
                            {"replica_acked", st.replica_acked},
                            {"mirrors_fetched", st.mirrors_fetched}}}});
  if (applied != total) {
    std::fprintf(stderr, "%s %s: applied %llu of %llu updates (%llu skipped, %llu peers lost)\n", kName, o.role.c_str(),
                 static_cast<unsigned long long>(applied), static_cast<unsigned long long>(total),
                 static_cast<unsigned long long>(st.skipped), static_cast<unsigned long long>(st.peers_lost));
    return 3;
  }
  return 0;
}

// ---- worker ----

int run_worker(const Options& o) {
  gradlane::check_memlock(2 * o.bytes + 2 * 4096);  // gradient + model (+ two headers)
  gradlane::Device device = open_device(o);
  header(o, device.info());
  ps::WorkerOptions worker_options;
  worker_options.id = o.id;
  worker_options.server = *o.server;
  worker_options.replica = o.replica;
  worker_options.mirror = !o.replica_reads;
  worker_options.floats = o.bytes / sizeof(float);
  worker_options.timeout = std::chrono::duration_cast<gradlane::Millis>(std::chrono::seconds(o.timeout_s));
  worker_options.transport = gradlane::TransportOptions::from_env();
  if (!o.sidecar.empty()) {
    worker_options.sidecar = sidecar_attach(o);
    worker_options.server_endpoint = o.server_endpoint;
  }
  ps::Worker worker(device, worker_options);  // connects (retrying while the server starts)
  std::ranges::fill(worker.gradient(), 1.0e-3F);

  std::vector<double> total_us, grant_us, wire_us;
  total_us.reserve(o.iterations);
  grant_us.reserve(o.iterations);
  wire_us.reserve(o.iterations);
  const auto t0 = Clock::now();
  auto before = t0;
  for (std::uint64_t i = 0; i < o.iterations; ++i) {
    // One worker: push i is computed on version i (every earlier one applied), which keeps it
    // within a sidecar's staleness bound (0 would be dropped as stale past tau pushes).
    const ps::PushResult r = worker.push(/*computed_on=*/i, /*tag=*/i);
    if (r.lost || r.dropped) {
      // A benchmark of the healthy path: a failover or a drop would make the figure meaningless.
      throw gradlane::Error(
          gradlane::Errc::peer_gone,
          fmt::format("push {} of {} was {}: the server {}; no throughput is reported", i + 1, o.iterations,
                      r.lost ? "lost" : "dropped",
                      r.lost ? "died mid-push (see the server's output)" : "refused it as too stale"));
    }
    const auto after = Clock::now();
    const double total = std::chrono::duration<double, std::micro>(after - before).count();
    const double wire = std::chrono::duration<double, std::micro>(r.wire_time).count();
    total_us.push_back(total);
    wire_us.push_back(wire);
    grant_us.push_back(std::max(0.0, total - wire));
    before = after;
  }
  const double seconds = std::chrono::duration<double>(before - t0).count();

  const std::uint64_t copies = o.replica && !o.replica_reads ? 2 : 1;
  const double bytes = static_cast<double>(o.bytes) * static_cast<double>(o.iterations);
  const double mbps = bytes / seconds / kBytesPerMB;
  const double gbps = bytes / seconds / kBytesPerGb;
  const double egress_mbps = mbps * static_cast<double>(copies);
  const double mpps = static_cast<double>(o.iterations) / seconds / 1e6;
  const Summary grant = summarise(grant_us), wire = summarise(wire_us), push = summarise(total_us);
  const double wire_share = std::accumulate(wire_us.begin(), wire_us.end(), 0.0) / (seconds * 1e6);
  // The wire rate while a push is writing: what the link does when it is busy.
  const double wire_mbps = static_cast<double>(o.bytes * copies) / (wire.avg * 1e-6) / kBytesPerMB;

  std::cout << " #bytes     #iterations    BW average[MB/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
            << fmt::format(" {:<10} {:<14} {:<21.2f} {:<20.6f} {:.6f}\n", o.bytes, o.iterations, mbps, gbps, mpps)
            << " #copies  egress BW[MB/sec]  t_grant avg/med/max[usec]   t_wire avg/med/max[usec]   wire "
               "BW[MB/sec]  wire share\n"
            << fmt::format(
                   " {:<8} {:<18.2f} {:>8.1f} {:>8.1f} {:>9.1f}  {:>9.1f} {:>9.1f} {:>9.1f}  {:<15.2f} {:.3f}\n",
                   copies, egress_mbps, grant.avg, grant.median, grant.max, wire.avg, wire.median, wire.max, wire_mbps,
                   wire_share)
            << std::string(79, '-') << '\n'
            << std::flush;
  nlohmann::json row = {{"MsgSize", o.bytes},           {"n_iterations", o.iterations}, {"bw_avg", mbps},
                        {"bw_unit", "MB/sec"},          {"bw_avg_gbps", gbps},          {"msgRate_avg", mpps},
                        {"egress_bw_avg", egress_mbps}, {"wire_bw_avg", wire_mbps},     {"wire_share", wire_share},
                        {"wall_seconds", seconds},      {"t_push_us", to_json(push)},   {"t_grant_us", to_json(grant)},
                        {"t_wire_us", to_json(wire)}};
  nlohmann::json info = {{"tool", kName},
                         {"role", "worker"},
                         {"device", device.info().name},
                         {"id", o.id},
                         {"server", fmt::format("{}:{}", o.server->address, o.server->port)},
                         {"replica", o.replica ? fmt::format("{}:{}", o.replica->address, o.replica->port) : ""},
                         {"copies", copies}};
  nlohmann::json document;
  document["test_info"] = std::move(info);
  document["results"] = nlohmann::json::array({std::move(row)});
  write_json(o.out_json, document);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto parsed = parse(argc, argv);
  if (const int* code = std::get_if<int>(&parsed)) return *code;
  const Options& o = std::get<Options>(parsed);
  try {
    return o.role == "worker" ? run_worker(o) : run_shard(o);
  } catch (const gradlane::Error& e) {
    std::fprintf(stderr, "%s %s: %s (%s)\n", kName, o.role.c_str(), e.what(),
                 std::string(gradlane::errc_name(e.code())).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s %s: %s\n", kName, o.role.c_str(), e.what());
    return 1;
  }
}
