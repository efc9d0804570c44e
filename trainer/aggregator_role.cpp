// The aggregator (aggregate mode): a gradlane::ps::Aggregator on a worker host. Workers push
// their gradients into its member slots; it sums each group in a fixed order straight into its
// registered buffer and forwards the sum as one update to the server (and the replica), so the
// server's ingress carries one update per group. Writes what it forwarded for the summary.
#include <gradlane/gradlane.hpp>
#include <gradlane/ps/metrics.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "config.hpp"
#include "role_metrics.hpp"
#include "train/model.hpp"

namespace gradlane::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// One line per forwarded update (its server sequence; computed_on is the oldest member's), one
// per member summed into it — written as each update is forwarded and flushed, so that what a
// killed aggregator forwarded can still be checked (tests/faults/fault_row.py).
class ForwardLog {
 public:
  explicit ForwardLog(const std::string& out)
      : updates_(out + "/aggregator.updates.csv"), members_(out + "/aggregator.members.csv") {
    updates_ << "sequence,group,computed_on,members,lost\n" << std::flush;
    members_ << "sequence,worker,step,computed_on\n" << std::flush;
  }
  // Writes the updates forwarded since the last call.
  void catch_up(const ps::Aggregator& aggregator) {
    const auto& history = aggregator.history();
    if (written_ == history.size()) return;
    for (; written_ < history.size(); ++written_) {
      const auto& u = history[written_];
      // Members first: an update line promises its members are on disk.
      for (const auto& m : u.members)
        members_ << u.sequence << ',' << m.worker << ',' << m.tag << ',' << m.computed_on << '\n';
      members_.flush();
      updates_ << u.sequence << ',' << u.tag << ',' << u.computed_on << ',' << u.members.size() << ','
               << (u.lost ? 1 : 0) << '\n';
    }
    updates_.flush();
  }

 private:
  std::ofstream updates_, members_;
  std::size_t written_ = 0;
};

void write_stats(const Config& c, const ps::Aggregator& aggregator) {
  const auto& st = aggregator.stats();
  std::ofstream(c.out + "/aggregator.stats.json")
      << "{\"group\":" << c.group << ",\"granted\":" << st.granted << ",\"summed\":" << st.summed
      << ",\"skipped\":" << st.skipped << ",\"forwarded\":" << st.forwarded << ",\"short_groups\":" << st.short_groups
      << ",\"lost\":" << st.lost << ",\"peers_lost\":" << st.peers_lost << ",\"peers_joined\":" << st.peers_joined
      << ",\"rejoins\":" << st.rejoins << ",\"bytes_copied\":" << st.bytes_copied << "}\n";
}

}  // namespace

int run_aggregator(const Config& c) {
  const gradlane::train::Model model(gradlane::train::ModelSpec{.kind = gradlane::train::parse_model_kind(c.model)});
  ps::AggregatorOptions options;
  options.id = c.id;
  options.transport = c.transport;
  options.server = ps::Endpoint::parse(c.server);
  if (!c.replica.empty()) options.replica = ps::Endpoint::parse(c.replica);
  options.floats = model.parameters();
  options.group = c.group;
  // Room for the next groups while one is summed and forwarded, so a slow member (a straggler
  // still writing) does not stop the others.
  options.slots = 4 * c.group;
  // Cut off from server and replica (a link down), its forward connects again, as its workers do.
  options.rejoin_within = std::chrono::seconds(c.rejoin_within_s);
  if (c.mode == Mode::gradlane) {  // gradlaned forms the groups; 16 member slots per worker
    sidecar::AttachOptions attach = sidecar::AttachOptions::from_env();  // GRADLANE_SIDECAR_TIMEOUT_MS
    attach.shm_name = c.sidecar;
    attach.job = c.job;
    attach.endpoint = c.endpoint;
    options.sidecar = attach;
    options.slots = 16;
    // Its ring has a partition per worker: a restarted one (--rejoin) takes none at its start.
    options.workers = c.peers != 0 ? c.peers : c.workers;
    options.grant_windows = c.grant_windows;  // each worker writes its own partition only
  }
  options.timeout = 120s;
  Device device = Device::open({.name = c.device});
  // The server may still be loading: its port refuses until it listens. Retried for a minute.
  std::optional<ps::Aggregator> aggregator;
  for (const auto give_up = Clock::now() + 60s; !aggregator;) {
    try {
      aggregator.emplace(device, c.port, options);
    } catch (const Error& e) {
      if (e.code() != Errc::connection_rejected || Clock::now() > give_up) throw;
      std::this_thread::sleep_for(200ms);
    }
  }
  aggregator->accept_workers(c.rejoin ? 0 : c.peers != 0 ? c.peers : c.workers, 300s);
  ForwardLog log(c.out);
  const RoleMetrics metrics(c.metrics, c.out + "/aggregator.metrics.prom", std::make_shared<ps::AggregatorMetrics>());
  bool finished = true;
  std::uint32_t idle = 0;
  const auto started = Clock::now();
  for (const auto give_up = started + 3600s; !aggregator->finished();) {
    if (aggregator->progress() != 0) {
      log.catch_up(*aggregator);
    } else if (++idle % 64 == 0) {  // a clock read costs ~1 µs under some VMs
      if (metrics) metrics->update(*aggregator);
      const auto now = Clock::now();
      if (c.rejoin && aggregator->stats().peers_joined == 0 && now > started + 60s) {
        std::fprintf(stderr,
                     "gradlane_train aggregator: restarted, and no worker came back in 60 s (is the job "
                     "over, or in gradlane mode, where a restarted aggregator is not found again?)\n");
        finished = false;
        break;
      }
      if (now > give_up) {
        finished = false;
        break;
      }
    }
  }
  log.catch_up(*aggregator);
  write_stats(c, *aggregator);
  if (metrics) {
    metrics->update(*aggregator);
    metrics.write_final();
  }
  const auto& st = aggregator->stats();
  std::printf(
      "aggregator: forwarded %llu updates summing %llu gradients (short groups %llu), skipped %llu, lost %llu\n",
      static_cast<unsigned long long>(st.forwarded), static_cast<unsigned long long>(st.summed),
      static_cast<unsigned long long>(st.short_groups), static_cast<unsigned long long>(st.skipped),
      static_cast<unsigned long long>(st.lost));
  return finished ? 0 : 3;
}

}  // namespace gradlane::trainer
