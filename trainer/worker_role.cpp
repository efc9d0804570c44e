// A worker: pull the model into its registered buffer, compute the minibatch gradient straight
// into its registered gradient buffer (no copy on either side), push it; `steps` times.
#include <gradlane/gradlane.hpp>
#include <gradlane/ps/metrics.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "config.hpp"
#include "role_metrics.hpp"
#include "train/data_order.hpp"
#include "train/dataset.hpp"
#include "train/model.hpp"

namespace gradlane::trainer {

namespace {
using Clock = std::chrono::steady_clock;

// Connects, retrying the errors `retry` accepts until `deadline`; then the error says what
// failed. The job's processes start together (a server still loading is not listening yet),
// and a worker rejoining after a link came back may find the server's port briefly unreachable.
template <typename Retry>
ps::Worker connect_until(const Device& device, ps::WorkerOptions options, Clock::time_point deadline, Retry retry) {
  for (bool said = false;; said = true) {
    try {
      // Each try ends by the deadline too (the constructor retries a port nobody listens on).
      options.connect_within = std::max(std::chrono::ceil<Millis>(deadline - Clock::now()), Millis(1));
      return ps::Worker(device, options);
    } catch (const Error& e) {
      if (!retry(e) || Clock::now() > deadline) throw;
      if (!said) {
        std::fprintf(stderr, "gradlane_train worker %u: %s; retrying for up to %lld s\n", options.id, e.what(),
                     static_cast<long long>(std::chrono::ceil<std::chrono::seconds>(deadline - Clock::now()).count()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

// ssp mode: waits until the slowest worker completed `steps` steps; true if it had to wait.
// `known`: the clock the last pull read (clocks only grow), which spares the READ when it
// suffices. Throws if that does not happen within `patience` (a worker gone or stalled holds
// every other).
bool wait_for_slowest(ps::Worker& worker, std::uint64_t known, std::uint64_t steps, std::uint32_t id,
                      std::chrono::milliseconds patience) {
  if (known >= steps) return false;
  const auto deadline = Clock::now() + patience;
  bool waited = false;
  for (std::uint64_t slowest = 0; (slowest = worker.slowest_clock()) < steps; waited = true) {
    if (Clock::now() > deadline) {
      throw std::runtime_error("worker " + std::to_string(id) + ": the slowest worker completed " +
                               std::to_string(slowest) + " steps and no more in " +
                               std::to_string(std::chrono::duration_cast<std::chrono::seconds>(patience).count()) +
                               " s; this one needs " + std::to_string(steps) +
                               " to go on (ssp): a worker is gone or stalled");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return waited;
}

// Rejoins the running job by `deadline`, through the worker's aggregator if it answers, else
// without it, pushing to the server as a worker whose aggregator died does: the link that cut
// this worker off may have cut its aggregator off from the server too, and it exited (seen in
// link:2 in aggregate mode). A few seconds each way, in turn.
ps::Worker rejoin(const Device& device, const ps::WorkerOptions& options, Clock::time_point deadline) {
  if (!options.aggregator) return connect_until(device, options, deadline, ps::out_of_reach);
  ps::WorkerOptions direct = options;
  direct.aggregator.reset();
  for (bool through_aggregator = true;; through_aggregator = !through_aggregator) {
    const auto until = std::min(deadline, Clock::now() + std::chrono::seconds(3));
    try {
      return connect_until(device, through_aggregator ? options : direct, until, ps::out_of_reach);
    } catch (const Error& e) {
      if (!ps::out_of_reach(e) || Clock::now() >= deadline) throw;
      if (through_aggregator) {
        std::fprintf(stderr, "gradlane_train worker %u: rejoining through the aggregator: %s; trying without it\n",
                     options.id, e.what());
      }
    }
  }
}
}  // namespace

int run_worker(const Config& c) {
  const gradlane::train::Model model(gradlane::train::ModelSpec{.kind = gradlane::train::parse_model_kind(c.model)});
  // Only the training files: under the emulator every decompressed megabyte costs.
  const std::filesystem::path dir = c.data.empty() ? gradlane::train::kDefaultFashionMnistDir : c.data;
  const auto load = [&] { return gradlane::train::load_fashion_mnist(dir, gradlane::train::Split::train); };
  // A worker that starts with the job loads its data first, so training starts (the server's
  // clock) when every worker is ready. One restarted mid-job joins first: the job ends when its
  // last worker leaves, and a load takes seconds in the emulator (11 s measured while the
  // others train), time in which the others could finish and leave it nobody to rejoin.
  const bool rejoining = c.first_step > 0;
  std::optional<gradlane::train::Dataset> loaded;
  if (!rejoining) loaded.emplace(load());
  gradlane::train::Workspace work;

  ps::WorkerOptions options;
  options.id = c.id;
  options.transport = c.transport;
  options.server = ps::Endpoint::parse(c.server);
  // aggregate mode: pushes go to the aggregator (pulls stay with the server); its forward is
  // what the replica mirrors. A worker given the replica as well mirrors only if its
  // aggregator dies and it pushes to the server directly.
  if (c.mode == Mode::aggregate) options.aggregator = ps::Endpoint::parse(c.aggregator);
  if (!c.replica.empty()) {
    options.replica = ps::Endpoint::parse(c.replica);
    options.mirror = !c.replica_reads;
  }
  // gradlane mode: the aggregator takes only what the sidecar redirects to it.
  if (c.mode == Mode::gradlane && !c.aggregator.empty()) {
    options.aggregator = ps::Endpoint::parse(c.aggregator);
    options.aggregator_endpoint = c.aggregator_endpoint;
  }
  options.floats = model.parameters();
  options.timeout = std::chrono::milliseconds(120000);
  if (c.mode == Mode::gradlane) {
    sidecar::AttachOptions attach = sidecar::AttachOptions::from_env();  // GRADLANE_SIDECAR_TIMEOUT_MS
    attach.shm_name = c.sidecar;
    attach.job = c.job;
    attach.endpoint = c.endpoint;
    options.sidecar = attach;
    options.server_endpoint = c.server_endpoint;
  }
  Device device = Device::open({.name = c.device});
  std::optional<ps::Worker> worker;
  worker.emplace(connect_until(device, options, Clock::now() + std::chrono::seconds(60),
                               [](const Error& e) { return e.code() == Errc::connection_rejected; }));
  if (rejoining) loaded.emplace(load());
  const auto& train = *loaded;
  const std::size_t train_rows = gradlane::train::rows_before_validation(train);
  // Each worker its own data order, reproducible from (seed, id); sharded, over its own rows only.
  gradlane::train::DataOrder batches =
      c.shard ? gradlane::train::DataOrder(train_rows, c.batch, c.seed, c.workers)
              : gradlane::train::DataOrder(train_rows, c.batch, c.seed * 1000003ULL + c.id);

  // Each push's fate, joined with the server's applied log by sequence. In aggregate mode the sequence is the
  // aggregator's member sequence; in gradlane mode a redirected push has sequence 0 and the sidecar's aggregate id. A
  // push the aggregator took is pending: acknowledged once the aggregator says its sum reached the server (members.csv:
  // the step, whether delivered, the server's sequence for the sum).
  std::ofstream pushes(c.out + "/worker" + std::to_string(c.id) + ".pushes.csv");
  pushes << "step,computed_on,sequence,aggregate,dropped,lost,pending\n";
  std::ofstream members(c.out + "/worker" + std::to_string(c.id) + ".members.csv");
  members << "step,delivered,sequence\n";
  std::uint64_t undelivered = 0;
  const auto log_outcomes = [&] {
    for (const ps::MemberOutcome& o : worker->take_member_outcomes()) {
      members << o.tag << ',' << (o.delivered ? 1 : 0) << ',' << o.sequence << '\n' << std::flush;
      undelivered += o.delivered ? 0 : 1;
    }
  };
  // A rejoining worker resumes after what its server took last: a restarted one's previous
  // life may have died between writing a push and logging it (pushing that step again would
  // apply it twice), and one that lost its links mid-push does not know whether that
  // push arrived. The server's answer counts as acknowledged; a push in flight it does not name
  // is lost (never resent: it may be applied, by a promoted replica holding its mirror). A
  // worker pushing to the server only: through an aggregator the server learns no tags.
  std::uint64_t lost = 0;
  const auto resume_after_landed = [&](std::uint64_t from, bool in_flight) {
    if (!options.aggregator) {
      if (const auto landed = worker->last_landed(); landed && landed->tag >= from) {
        std::fprintf(stderr,
                     "gradlane_train worker %u: the server took step %llu already (sequence %llu): resuming "
                     "after it\n",
                     c.id, static_cast<unsigned long long>(landed->tag),
                     static_cast<unsigned long long>(landed->sequence));
        pushes << landed->tag << ',' << landed->computed_on << ',' << landed->sequence << ",0,0,0,0\n" << std::flush;
        return landed->tag + 1;
      }
    }
    if (!in_flight) return from;
    pushes << from << ",0,0,0,0,1,0\n" << std::flush;
    ++lost;
    return from + 1;
  };
  std::uint64_t first_step = rejoining ? resume_after_landed(c.first_step, false) : c.first_step;
  std::uint64_t dropped = 0, skipped_steps = 0, pull_retries = 0, rejoins = 0, failovers = 0, ssp_waits = 0;
  std::uint64_t slowest_seen = 0;  // ssp mode: the slowest worker's clock the last pull read
  std::chrono::nanoseconds computing{0}, pushing{0}, waiting{0}, rejoining_for{0};
  const RoleMetrics metrics(c.metrics, c.out + "/worker" + std::to_string(c.id) + ".metrics.prom",
                            std::make_shared<ps::WorkerMetrics>(c.id));
  const auto start = Clock::now();
  for (std::uint64_t step = first_step; step < c.steps;) {
    bool in_flight = false;  // the push of `step` was started: never computed again
    try {
      const auto t0 = Clock::now();
      if (is_synchronous(c.mode)) {
        // The barrier: step k starts on the model that holds all N gradients of steps < k.
        const std::uint64_t want = step * gradients_per_step(c);
        while (worker->server_version() < want) std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      if (c.mode == Mode::ssp && step > c.ssp_bound) {
        ssp_waits += wait_for_slowest(*worker, slowest_seen, step - c.ssp_bound, c.id, options.timeout) ? 1 : 0;
      }
      const ps::PullResult pulled = worker->pull();
      slowest_seen = pulled.slowest_clock;
      pull_retries += pulled.attempts - 1;
      if (c.mode == Mode::backup) {
        // Steps that the others completed while this worker computed a dropped gradient (or
        // waited): it joins the step the model it pulled belongs to.
        const std::uint64_t current = pulled.version / gradients_per_step(c);
        if (current > step) {
          skipped_steps += current - step;
          step = current;
          if (step >= c.steps) break;
        }
      }
      const auto t1 = Clock::now();
      // Zero-copy: the model the READs brought is the input, the registered buffer the output.
      (void)model.gradient(worker->model(), train, batches.next(c.id - 1), worker->gradient(), work);
      const auto t2 = Clock::now();
      if (c.mode == Mode::gradlane && c.declare_remaining) {
        // This worker's steps left, as if every worker of the job had as many: the job's work left.
        worker->set_job_remaining((c.steps - step) * options.floats * sizeof(float) * c.workers);
      }
      in_flight = true;
      const ps::PushResult pushed = worker->push(pulled.version, step);
      dropped += pushed.dropped ? 1 : 0;
      lost += pushed.lost ? 1 : 0;
      pushes << step << ',' << pulled.version << ',' << pushed.sequence << ',' << pushed.aggregate << ','
             << (pushed.dropped ? 1 : 0) << ',' << (pushed.lost ? 1 : 0) << ',' << (pushed.pending ? 1 : 0) << '\n'
             << std::flush;  // line by line: a worker killed mid-run leaves what it saw acknowledged
      log_outcomes();
      waiting += t1 - t0;
      computing += t2 - t1;
      pushing += Clock::now() - t2;
      metrics->record(pushed, Clock::now() - t2);
      ++step;
    } catch (const Error& e) {
      // Server and replica both out of reach (Worker failed over already where it could): a
      // link down, as the link:2 fault does for 4 s. Rejoin the running job as a restarted
      // worker would, its connections new, instead of ending a worker that will be needed.
      if (!ps::out_of_reach(e) || c.rejoin_within_s == 0) throw;
      const auto lost_at = Clock::now();
      std::fprintf(stderr,
                   "gradlane_train worker %u: lost its server and replica at step %llu (%s); rejoining the "
                   "running job for up to %u s\n",
                   c.id, static_cast<unsigned long long>(step), e.what(), c.rejoin_within_s);
      failovers += worker->failovers();
      worker.reset();
      worker.emplace(rejoin(device, options, lost_at + std::chrono::seconds(c.rejoin_within_s)));
      slowest_seen = 0;  // read again from the server it rejoined
      step = resume_after_landed(step, in_flight);
      ++rejoins;
      rejoining_for += Clock::now() - lost_at;
      std::fprintf(stderr, "gradlane_train worker %u: rejoined the running job %.3f s after losing it, at step %llu\n",
                   c.id, std::chrono::duration<double>(Clock::now() - lost_at).count(),
                   static_cast<unsigned long long>(step));
    }
  }
  // The last members' outcomes: the aggregator forwards what it holds once told we are done.
  const bool settled = worker->settle(std::chrono::seconds(30));
  log_outcomes();
  metrics.write_final();
  const auto seconds = [](auto d) { return std::chrono::duration<double>(d).count(); };
  std::ofstream(c.out + "/worker" + std::to_string(c.id) + ".json")
      << "{\"id\":" << c.id << ",\"mode\":\"" << to_string(c.mode) << "\",\"steps\":" << c.steps
      << ",\"dropped\":" << dropped << ",\"skipped_steps\":" << skipped_steps << ",\"ssp_waits\":" << ssp_waits
      << ",\"lost\":" << lost << ",\"undelivered\":" << undelivered
      << ",\"unsettled\":" << (settled ? 0 : worker->members_pending())
      << ",\"failovers\":" << failovers + worker->failovers() << ",\"rejoins\":" << rejoins
      << ",\"rejoining_s\":" << seconds(rejoining_for) << ",\"pull_retries\":" << pull_retries
      << ",\"seconds\":" << seconds(Clock::now() - start) << ",\"pull_s\":" << seconds(waiting)
      << ",\"compute_s\":" << seconds(computing) << ",\"push_s\":" << seconds(pushing) << "}\n";
  return 0;
}

}  // namespace gradlane::trainer
