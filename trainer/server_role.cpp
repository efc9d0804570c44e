// The server (or its replica): a gradlane::ps::ShardServer holding the whole model, applying
// the workers' gradients with SGD in sequence order. Records the model every snapshot_ms for
// the offline evaluation and prints a progress line every second.
#include <gradlane/gradlane.hpp>
#include <gradlane/ps/metrics.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <fcntl.h>
#include <fstream>
#include <thread>
#include <unistd.h>

#include "config.hpp"
#include "role_metrics.hpp"
#include "snapshots.hpp"
#include "train/dataset.hpp"
#include "train/model.hpp"

namespace gradlane::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// `error`: why the role stops early (empty when it finished): a role that exits on an error
// still leaves what it applied, so the fault checker can verify every acknowledged update.
// `start_unix`: when training started (every worker connected), as a Unix time: jobs that share
// hosts are compared on one clock (perf/train/tenants.sh).
void write_stats(const Config& c, const ps::ShardServer& shard, const std::string& name, double start_unix,
                 double seconds, const std::string& error = {}) {
  const auto& st = shard.stats();
  std::string quoted;
  for (const char ch : error) {
    if (ch == '"' || ch == '\\') quoted += '\\';
    quoted += (static_cast<unsigned char>(ch) < 0x20) ? ' ' : ch;
  }
  std::ofstream(c.out + "/" + name + ".stats.json")
      << "{\"mode\":\"" << to_string(c.mode) << "\",\"version\":" << shard.version() << ",\"applied\":" << st.applied
      << ",\"skipped\":" << st.skipped << ",\"refused_doorbells\":" << st.refused_doorbells
      << ",\"peers_lost\":" << st.peers_lost << ",\"peers_joined\":" << st.peers_joined
      << ",\"replica_acked\":" << st.replica_acked << ",\"promoted_at_ns\":" << st.promoted_at_ns
      << ",\"lost_in_failover\":" << st.lost_in_failover << ",\"replicas_joined\":" << st.replicas_joined
      << ",\"joined_at\":" << st.joined_at << ",\"sidecars_resumed\":" << st.sidecars_resumed
      << ",\"claimed\":" << st.claimed << ",\"refused_claims\":" << st.refused_claims
      << ",\"start_unix\":" << std::fixed << start_unix << std::defaultfloat << ",\"seconds\":" << seconds
      << ",\"error\":\"" << quoted << "\"}\n";
  // What was applied, in order: the delay of each update is (updates applied before it) −
  // (the version it was computed on).
  std::ofstream log(c.out + "/" + name + ".applied.csv");
  log << "sequence,worker,step,computed_on,skipped,doorbell_ns,apply_start_ns,apply_end_ns\n";
  for (const auto& u : shard.history()) {
    log << u.sequence << ',' << u.worker << ',' << u.tag << ',' << u.computed_on << ',' << (u.skipped ? 1 : 0) << ','
        << u.doorbell_ns << ',' << u.apply_start_ns << ',' << u.apply_end_ns << '\n';
  }
  std::ofstream model(c.out + "/" + name + ".model", std::ios::binary);
  model.write(reinterpret_cast<const char*>(shard.model().data()),
              static_cast<std::streamsize>(shard.model().size_bytes()));
}

// Every model version this role saw between progress() rounds, with a hash of its bytes, one
// unbuffered line each ("version,hash"): a SIGKILL loses none of them. Server and replica
// logs are compared at their common versions (tests/faults/fault_row.py): bitwise equal
// models at equal versions, also for a role that was killed.
class VersionLog {
 public:
  explicit VersionLog(const std::string& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644)) {
    if (fd_ < 0) throw std::runtime_error("cannot create " + path);
  }
  VersionLog(const VersionLog&) = delete;
  VersionLog& operator=(const VersionLog&) = delete;
  ~VersionLog() { ::close(fd_); }
  void record(std::uint64_t version, std::span<const float> model) {
    if (version == last_) return;
    last_ = version;
    // FNV-1a over the model's 64-bit words (the tail byte-wise).
    std::uint64_t hash = 14695981039346656037ULL;
    const auto* bytes = reinterpret_cast<const unsigned char*>(model.data());
    const std::size_t n = model.size_bytes();
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, bytes + i, 8);
      hash = (hash ^ word) * 1099511628211ULL;
    }
    for (; i < n; ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
    char line[64];
    const int len = std::snprintf(line, sizeof line, "%llu,%016llx\n", static_cast<unsigned long long>(version),
                                  static_cast<unsigned long long>(hash));
    if (::write(fd_, line, static_cast<std::size_t>(len)) != len)
      throw std::runtime_error("writing the version log failed");
  }

 private:
  int fd_;
  std::uint64_t last_ = ~0ULL;
};

}  // namespace

int run_server(const Config& c) {
  const bool is_server = c.role == "server";
  const std::string name = !c.name.empty() ? c.name : is_server ? "server" : "replica";
  const gradlane::train::Model model(gradlane::train::ModelSpec{.kind = gradlane::train::parse_model_kind(c.model)});
  // The live accuracy: a fixed subset of the test set (the offline evaluation uses all of it).
  gradlane::train::Dataset live;
  if (is_server && c.live_eval > 0) {
    const std::filesystem::path dir = c.data.empty() ? gradlane::train::kDefaultFashionMnistDir : c.data;
    const auto test = gradlane::train::load_fashion_mnist(dir, gradlane::train::Split::test);
    live = test.slice(0, std::min<std::size_t>(c.live_eval, test.rows));
  }

  ps::ShardOptions options;
  options.transport = c.transport;
  options.floats = model.parameters();
  options.slots = c.slots;
  options.read_updates_from_server = c.replica_reads;
  options.grant_windows = c.grant_windows;                        // the replica's ring too: mirrors are claimed
  options.rejoin_grace = std::chrono::seconds(c.rejoin_grace_s);  // a worker cut off by a link may come back
  // sync and backup: every step's N gradients are applied one by one at lr/N — their average at
  // lr; backup mode's server takes only the first N of each step (its round).
  options.learning_rate =
      is_synchronous(c.mode) ? c.learning_rate / static_cast<float>(gradients_per_step(c)) : c.learning_rate;
  if (c.mode == Mode::backup) options.round = gradients_per_step(c);
  if (c.mode == Mode::ssp) options.clock_workers = c.workers;  // each worker tags its pushes with its step
  // The server attaches to its host's gradlaned; the replica follows the server's decisions
  // and attaches to its own host's only if promoted, to take the server's sequence over there.
  if (c.mode == Mode::gradlane && !c.sidecar.empty()) {
    sidecar::AttachOptions attach = sidecar::AttachOptions::from_env();  // GRADLANE_SIDECAR_TIMEOUT_MS
    attach.shm_name = c.sidecar;
    attach.job = c.job;
    attach.endpoint = c.endpoint;
    options.sidecar = attach;
  }
  std::vector<float> initial(options.floats);
  model.initialise(initial, c.seed);

  Device device = Device::open({.name = c.device});
  ps::ShardServer shard(device, is_server ? ps::Role::server : ps::Role::replica, c.port, options, initial);
  const RoleMetrics metrics(
      c.metrics, c.out + "/" + name + ".metrics.prom",
      std::make_shared<ps::ServerMetrics>(is_server ? "server" : "replica", options.floats * sizeof(float)));
  if (is_server && !c.replica.empty()) {
    // The replica may still be starting: retried for a minute while nothing listens.
    const auto replica = ps::Endpoint::parse(c.replica);
    for (const auto give_up = Clock::now() + 60s;;) {
      try {
        shard.connect_replica(replica.address, replica.port, 60s);
        break;
      } catch (const Error& e) {
        if (e.code() != Errc::connection_rejected || Clock::now() > give_up) throw;
        std::this_thread::sleep_for(200ms);
      }
    }
  }
  if (!c.join.empty()) {
    const auto server = ps::Endpoint::parse(c.join);
    shard.join_server(server.address, server.port, 60s);
  } else {
    shard.accept_peers(c.peers != 0 ? c.peers : c.workers, 300s);
  }

  // Training starts when every worker is connected: the snapshots' time origin.
  const auto start = Clock::now();
  const double start_unix = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::optional<SnapshotWriter> snapshots;
  if (is_server) {
    snapshots.emplace(c.out + "/snapshots.bin");
    snapshots->write(0, shard.version(), shard.model());  // the initial model, at time 0
  }
  auto next_snapshot = start + std::chrono::milliseconds(c.snapshot_ms), next_line = start + 1s;
  std::uint64_t line_version = 0;
  const bool tty = isatty(STDOUT_FILENO) != 0;
  const auto deadline = start + 3600s;
  VersionLog versions(c.out + "/" + name + ".versions.csv");
  versions.record(shard.version(), shard.model());
  while (!shard.finished() && Clock::now() < deadline) {
    std::size_t work = 0;
    try {
      work = shard.progress();
    } catch (const std::exception& e) {
      versions.record(shard.version(), shard.model());
      write_stats(c, shard, name, start_unix, std::chrono::duration<double>(Clock::now() - start).count(), e.what());
      throw;
    }
    versions.record(shard.version(), shard.model());
    if (work != 0) continue;
    if (metrics) metrics->update(shard);
    const auto now = Clock::now();
    if (snapshots && now >= next_snapshot) {
      snapshots->write((now - start).count(), shard.version(), shard.model());
      next_snapshot += std::chrono::milliseconds(c.snapshot_ms);
    }
    if (is_server && now >= next_line) {
      const double t = std::chrono::duration<double>(now - start).count();
      const double accuracy = live.rows > 0 ? model.accuracy(shard.model(), live) : 0.0;
      std::printf("%s[%s] %6.1f s  version %6llu  %6.1f updates/s  accuracy %.3f (%zu test images)  holes %llu%s",
                  tty ? "\r" : "", to_string(c.mode), t, static_cast<unsigned long long>(shard.version()),
                  static_cast<double>(shard.version() - line_version), accuracy, live.rows,
                  static_cast<unsigned long long>(shard.stats().skipped), tty ? "" : "\n");
      std::fflush(stdout);
      line_version = shard.version();
      next_line += 1s;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (snapshots) snapshots->write((Clock::now() - start).count(), shard.version(), shard.model());
  shard.drain_replica(30s);  // before the stats, so they show what the replica acknowledged
  versions.record(shard.version(), shard.model());
  write_stats(c, shard, name, start_unix, seconds);
  if (metrics) {
    metrics->update(shard);
    metrics.write_final();
  }
  std::printf("%s%s: version %llu after %.1f s, applied %llu, holes skipped %llu, peers lost %llu\n", tty ? "\n" : "",
              name.c_str(), static_cast<unsigned long long>(shard.version()), seconds,
              static_cast<unsigned long long>(shard.stats().applied),
              static_cast<unsigned long long>(shard.stats().skipped),
              static_cast<unsigned long long>(shard.stats().peers_lost));
  if (is_server && shard.cut_off()) {
    std::fprintf(stderr,
                 "%s: cut off at version %llu: lost every worker, none of which said it finished; the "
                 "replica (promoted) may carry the job on; versions past %llu, which it never confirmed, are not "
                 "the job's\n",
                 name.c_str(), static_cast<unsigned long long>(shard.version()),
                 static_cast<unsigned long long>(shard.stats().replica_acked));
    return 6;
  }
  if (shard.stats().stepped_down) {
    std::fprintf(stderr,
                 "%s: stepped down at version %llu: a worker failed over to the replica, which carries the "
                 "job on; this model is not the job's final one\n",
                 name.c_str(), static_cast<unsigned long long>(shard.version()));
    return 5;
  }
  return shard.finished() ? 0 : 3;
}

}  // namespace gradlane::trainer
