// One role of a parameter-server run over gradlane's ps API: a shard server, its replica, or a
// worker that pulls, computes a (synthetic, deterministic) gradient and pushes it. The
// softroce tests run these as separate processes on separate emulated hosts and check what
// they write: the server's and the replica's final models, the order the server applied.
//
//   ps_node role=replica device=rxe1 port=7801 floats=4096 slots=8 workers=4 updates=50 out=DIR
//   ps_node role=server  device=rxe0 port=7800 floats=4096 slots=8 workers=4 updates=50 out=DIR
//           replica=ADDR:7801 [die_at=K]: SIGKILL itself once it has applied K updates
//           [die_behind_hole=N]: SIGKILL itself once N updates wait behind a sequence not
//           yet written (a worker holding its grant)
//   ps_node role=worker  device=rxe2 id=1 server=ADDR:7800 replica=ADDR:7801 floats=4096
//           updates=50 gradient=pattern|uniform out=DIR [die_after=K] [aggregator=ADDR:7802]
//           [stall_after=K stall_ms=M]: at step K, stall M ms between the request and the grant
//           [grant_lifetime_ms=1500]: WorkerOptions::grant_lifetime
//           [failover_patience_ms=5000]: WorkerOptions::failover_patience
//           [first_step=K]: start at step K (a restarted worker rejoining the running job)
//           [pace_ms=M]: M ms of "compute" before each step
//   ps_node role=replica ... join=ADDR:7801 name=replica2: a new replica joining the running
//           server at ADDR (ShardServer::join_server), e.g. a promoted replica; writes NAME.*
//   replica_reads=1 (replica and workers): workers do not mirror; the replica reads each update
//           from the server's slot
//   grant_windows=1 (server and replica): ShardOptions::grant_windows, a worker may write only its granted slot
//   momentum=M (server, replica): SGD with momentum M (ShardOptions::momentum); a joining replica gets the velocity
//   ps_node role=aggregator device=rxe2 port=7802 id=9 server=ADDR:7800 replica=ADDR:7801
//           floats=4096 group=4 workers=4 out=DIR [slots=8] [linger_ms=500] [hole_timeout_ms=3000]
//           [die_after_forwards=K]: after its K-th forward, stop for a second (workers write
//           their granted members meanwhile) and SIGKILL itself, holding members not forwarded
//           [rejoin=1 name=aggregator2]: a restarted aggregator: accepts no worker at its start;
//           the ones that lost it come back (the server tells them where it listens)
//
// With aggregator=, a worker pushes to the aggregator, which sums groups of `group` updates and
// forwards each sum to the server and replica as worker `id`: the server and the replica then
// count the aggregator among their `workers`. The aggregator writes what it forwarded
// (aggregator.jsonl: the group's tag, the server's sequence, the members in sum order) and
// each sum it wrote (aggregator.sums: the floats of every forwarded update, in order).
//
// Transport knobs come from the environment (TransportOptions::from_env: GRADLANE_ACK_TIMEOUT,
// GRADLANE_RETRY_COUNT, ...). `updates` is per worker. gradient=uniform makes every float of an
// update the same value, so every model version is uniform too: a pull that mixed two versions
// shows as unequal floats.
#include <gradlane/gradlane.hpp>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "ps_synthetic.hpp"

using namespace std::chrono_literals;

namespace {

struct Args {
  std::map<std::string, std::string> values;
  const std::string& text(const std::string& key) const {
    const auto it = values.find(key);
    if (it == values.end()) throw std::runtime_error("missing argument " + key + "=...");
    return it->second;
  }
  std::uint64_t number(const std::string& key) const { return std::stoull(text(key)); }
  std::uint64_t number(const std::string& key, std::uint64_t fallback) const {
    return values.contains(key) ? number(key) : fallback;
  }
  gradlane::ps::Endpoint endpoint(const std::string& key) const { return gradlane::ps::Endpoint::parse(text(key)); }
  std::vector<std::string> list(const std::string& key) const {
    std::vector<std::string> items;
    std::stringstream in(text(key));
    for (std::string item; std::getline(in, item, ',');) items.push_back(item);
    return items;
  }
  // tensors=N,N,... shards=S: the model's tensors spread over S servers (ps::place_tensors).
  std::vector<std::size_t> tensors() const {
    std::vector<std::size_t> sizes;
    for (const auto& t : list("tensors")) sizes.push_back(std::stoull(t));
    return sizes;
  }
};

using gradlane::examples::gradient_value;
using gradlane::examples::initial_value;

void write_model(const std::string& path, std::span<const float> model) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(model.data()), static_cast<std::streamsize>(model.size_bytes()));
}

int run_shard(const Args& a, gradlane::ps::Role role) {
  const std::string out = a.text("out");
  const std::string name = a.values.contains("name")            ? a.text("name")
                           : role == gradlane::ps::Role::server ? "server"
                                                                : "replica";
  gradlane::ps::ShardOptions options;
  if (a.values.contains("tensors")) {  // this server holds shard `shard` of a sharded model
    const auto shards = static_cast<std::uint32_t>(a.number("shards"));
    const auto tensors = a.tensors();
    options.floats =
        gradlane::ps::shard_floats(gradlane::ps::place_tensors(tensors, shards), shards).at(a.number("shard"));
  } else {
    options.floats = a.number("floats");
  }
  options.slots = static_cast<std::uint32_t>(a.number("slots", 8));
  options.learning_rate = gradlane::examples::kLearningRate;
  options.hole_timeout = std::chrono::milliseconds(a.number("hole_timeout_ms", 3000));
  options.read_updates_from_server = a.number("replica_reads", 0) != 0;  // replica_reads=1: workers do not mirror
  // Server and replica alike: a window per grant over its slot (the replica's: per mirror claim).
  options.grant_windows = a.number("grant_windows", 0) != 0;
  // momentum=M (server and replica alike): SGD with momentum, ShardOptions::momentum.
  if (a.values.contains("momentum")) options.momentum = std::stof(a.text("momentum"));
  options.transport = gradlane::TransportOptions::from_env();  // GRADLANE_ACK_TIMEOUT, _RETRY_COUNT, ...
  if (a.values.contains("sidecar")) {  // sidecar=SHM_NAME, endpoint=ID: the host's gradlaned owns the sequence
    auto attach = gradlane::sidecar::AttachOptions::from_env();  // GRADLANE_SIDECAR_TIMEOUT_MS
    attach.shm_name = a.text("sidecar");
    attach.job = 1;
    attach.endpoint = static_cast<std::uint32_t>(a.number("endpoint"));
    options.sidecar = attach;
  }
  const std::uint64_t workers = a.number("workers"), total = workers * a.number("updates");
  std::vector<float> initial(options.floats);
  for (std::size_t j = 0; j < initial.size(); ++j) initial[j] = initial_value(j);

  gradlane::Device device = gradlane::Device::open({.name = a.text("device")});
  gradlane::ps::ShardServer shard(device, role, static_cast<std::uint16_t>(a.number("port")), options, initial);
  if (role == gradlane::ps::Role::server && a.values.contains("replica")) {
    const auto replica = a.endpoint("replica");
    shard.connect_replica(replica.address, replica.port, 60s);
  }
  if (a.values.contains("join")) {
    const auto server = a.endpoint("join");
    shard.join_server(server.address, server.port, 60s);
  } else {
    shard.accept_peers(workers, 120s);
    std::fprintf(stderr, "%s: every peer joined\n", name.c_str());  // tests act on it
  }
  // Until every update is decided, or every worker left (some may have died) with nothing owed.
  // die_at=K: the server kills itself (SIGKILL, as kill -9) once it has applied K updates.
  bool done = false;
  const auto write_history = [&] {
    std::ofstream log(out + "/" + name + ".jsonl");
    for (const auto& u : shard.history()) {
      log << "{\"seq\":" << u.sequence << ",\"worker\":" << u.worker << ",\"tag\":" << u.tag
          << ",\"computed_on\":" << u.computed_on << ",\"skipped\":" << (u.skipped ? "true" : "false")
          << ",\"doorbell_ns\":" << u.doorbell_ns << ",\"apply_start_ns\":" << u.apply_start_ns
          << ",\"apply_end_ns\":" << u.apply_end_ns << "}\n";
    }
  };
  const std::uint64_t die_at = a.number("die_at", 0);
  if (die_at != 0 && role == gradlane::ps::Role::replica) {
    // A replica with die_at=K: once promoted and at version K it writes its history (what it
    // applied, for the test's reference) and SIGKILLs itself: the server dies a second time.
    const auto give_up = std::chrono::steady_clock::now() + 300s;
    while (shard.stats().promoted_at_ns == 0 || shard.version() < die_at) {
      shard.progress();
      if (std::chrono::steady_clock::now() > give_up) {
        std::fprintf(stderr, "%s: not promoted and at version %llu within 300 s\n", name.c_str(),
                     static_cast<unsigned long long>(die_at));
        return 3;
      }
    }
    write_history();
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  // stall_after_promotion_ms=N (a replica): once promoted, N ms without progress() — a loaded
  // host between its takeover and its next round, while its sidecar grants at once and the
  // workers write (what a takeover must survive: ps_softroce_test's sidecar failover).
  if (const std::uint64_t stall = a.number("stall_after_promotion_ms", 0);
      stall != 0 && role == gradlane::ps::Role::replica) {
    const auto give_up = std::chrono::steady_clock::now() + 300s;
    while (shard.stats().promoted_at_ns == 0 && !shard.finished() && std::chrono::steady_clock::now() < give_up) {
      shard.progress();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(stall));
  }
  // die_behind_hole=N: the server kills itself once N updates wait behind a sequence not yet
  // written (a worker holds its grant): written, acknowledged and not yet applied. Behind the
  // same sequence for a second: a write merely slow to come (a sanitized build under TCG) lets
  // the others fill the window too, for a moment, and is not the held grant.
  const std::uint64_t die_behind_hole = a.number("die_behind_hole", 0);
  if (role == gradlane::ps::Role::server && (die_at != 0 || die_behind_hole != 0)) {
    std::optional<std::pair<std::uint64_t, std::chrono::steady_clock::time_point>> behind;  // version, since
    const auto dies = [&] {
      if (die_behind_hole == 0) return shard.version() >= die_at;
      if (shard.waiting_behind_hole() < die_behind_hole) {
        behind.reset();
        return false;
      }
      const auto now = std::chrono::steady_clock::now();
      if (!behind || behind->first != shard.version()) behind.emplace(shard.version(), now);
      return now - behind->second >= 1s;
    };
    while (!dies()) shard.progress();
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    std::ofstream(out + "/server.died") << std::chrono::duration_cast<std::chrono::nanoseconds>(now).count() << " "
                                        << shard.version() << "\n";
    std::raise(SIGKILL);
  } else {
    done = shard.run_until(total, 300s);
    // A skipped sequence (a hole) carries no update: go on until every update is applied or no
    // worker is left.
    while (done && !shard.finished() && shard.stats().applied < total) {
      done = shard.run_until(total + shard.stats().skipped, 300s);
    }
  }
  shard.drain_replica(30s);  // before the stats, so they show what the replica acknowledged
  write_model(out + "/" + name + ".model", shard.model());
  write_history();
  const auto& st = shard.stats();
  std::ofstream(out + "/" + name + ".stats.json")
      << "{\"version\":" << shard.version() << ",\"applied\":" << st.applied << ",\"skipped\":" << st.skipped
      << ",\"refused_doorbells\":" << st.refused_doorbells << ",\"peers_lost\":" << st.peers_lost
      << ",\"peers_left\":" << st.peers_left << ",\"peers_joined\":" << st.peers_joined
      << ",\"joins_refused\":" << st.joins_refused << ",\"promoted_at_ns\":" << st.promoted_at_ns
      << ",\"lost_in_failover\":" << st.lost_in_failover << ",\"mirrors_fetched\":" << st.mirrors_fetched
      << ",\"replicas_joined\":" << st.replicas_joined << ",\"joined_at\":" << st.joined_at
      << ",\"sidecars_resumed\":" << st.sidecars_resumed << ",\"claimed\":" << st.claimed
      << ",\"refused_claims\":" << st.refused_claims << ",\"refused_cancels\":" << st.refused_cancels
      << ",\"held_cancels\":" << st.held_cancels << ",\"refused_requests\":" << st.refused_requests
      << ",\"stepped_down\":" << (st.stepped_down ? "true" : "false") << "}\n";
  std::printf(
      "%s: version %llu, applied %llu, skipped %llu, refused doorbells %llu, peers lost %llu, left %llu, "
      "replica acked %llu, updates read from the server %llu\n",
      name.c_str(), static_cast<unsigned long long>(shard.version()), static_cast<unsigned long long>(st.applied),
      static_cast<unsigned long long>(st.skipped), static_cast<unsigned long long>(st.refused_doorbells),
      static_cast<unsigned long long>(st.peers_lost), static_cast<unsigned long long>(st.peers_left),
      static_cast<unsigned long long>(st.replica_acked), static_cast<unsigned long long>(st.mirrors_fetched));
  if (!done) std::fprintf(stderr, "%s: timed out\n", name.c_str());
  if (st.stepped_down) {
    std::fprintf(stderr,
                 "%s: stepped down at version %llu: a worker failed over to the replica, which carries the "
                 "job on; this model is not the job's final one\n",
                 name.c_str(), static_cast<unsigned long long>(shard.version()));
    return 5;
  }
  return done ? 0 : 3;
}

// A worker of a sharded model: servers=A:P,B:Q,... tensors=N,N,... (one shard per server).
int run_sharded_worker(const Args& a) {
  const auto id = static_cast<std::uint32_t>(a.number("id"));
  std::vector<gradlane::ps::WorkerOptions> shards;
  for (const auto& server : a.list("servers")) {
    gradlane::ps::WorkerOptions o;
    o.id = id;
    o.server = gradlane::ps::Endpoint::parse(server);
    shards.push_back(o);
  }
  const auto tensors = a.tensors();
  gradlane::Device device = gradlane::Device::open({.name = a.text("device")});
  gradlane::ps::ShardedWorker worker(device, tensors, shards);
  const std::uint64_t updates = a.number("updates");
  for (std::uint64_t step = 0; step < updates; ++step) {
    std::vector<std::uint64_t> versions;
    for (const auto& pulled : worker.pull()) versions.push_back(pulled.version);
    for (std::uint32_t s = 0; s < shards.size(); ++s) {  // each shard's gradient, by its own index
      auto gradient = worker.shard(s).gradient();
      for (std::size_t j = 0; j < gradient.size(); ++j) gradient[j] = gradient_value(id, step, j, false);
    }
    worker.push(versions, step);
  }
  // A pull of a tensor the model does not have is refused with a clear error.
  try {
    (void)worker.model(tensors.size());
    return 5;
  } catch (const gradlane::Error& e) {
    if (e.code() != gradlane::Errc::invalid_argument) return 5;
  }
  std::ofstream(a.text("out") + "/worker" + a.text("id") + ".json") << "{\"pushes\":" << updates << "}\n";
  return 0;
}

int run_aggregator(const Args& a) {
  const std::string out = a.text("out");
  gradlane::ps::AggregatorOptions options;
  options.id = static_cast<std::uint32_t>(a.number("id"));
  options.server = a.endpoint("server");
  if (a.values.contains("replica")) options.replica = a.endpoint("replica");
  options.floats = a.number("floats");
  options.group = static_cast<std::uint32_t>(a.number("group"));
  options.slots = static_cast<std::uint32_t>(a.number("slots", 0));
  options.linger = std::chrono::milliseconds(a.number("linger_ms", 500));
  options.hole_timeout = std::chrono::milliseconds(a.number("hole_timeout_ms", 3000));
  options.transport = gradlane::TransportOptions::from_env();
  gradlane::Device device = gradlane::Device::open({.name = a.text("device")});
  gradlane::ps::Aggregator aggregator(device, static_cast<std::uint16_t>(a.number("port")), options);
  aggregator.accept_workers(a.number("rejoin", 0) != 0 ? 0 : a.number("workers"), 120s);
  const std::string name = a.values.contains("name") ? a.text("name") : "aggregator";
  std::ofstream sums(out + "/" + name + ".sums", std::ios::binary);
  const auto deadline = std::chrono::steady_clock::now() + 300s;
  const std::uint64_t die_after_forwards = a.number("die_after_forwards", ~0ull);
  while (!aggregator.finished() && std::chrono::steady_clock::now() < deadline) {
    const std::size_t forwarded = aggregator.history().size();
    aggregator.progress();
    if (aggregator.history().size() != forwarded) {  // one forward per progress(): its sum
      const auto sum = aggregator.last_sum();
      sums.write(reinterpret_cast<const char*>(sum.data()), static_cast<std::streamsize>(sum.size_bytes()));
    }
    if (aggregator.history().size() == die_after_forwards) {
      std::this_thread::sleep_for(1s);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
  }
  std::ofstream log(out + "/" + name + ".jsonl");
  for (const auto& u : aggregator.history()) {
    log << "{\"tag\":" << u.tag << ",\"seq\":" << u.sequence << ",\"computed_on\":" << u.computed_on
        << ",\"lost\":" << (u.lost ? "true" : "false") << ",\"members\":[";
    for (std::size_t i = 0; i < u.members.size(); ++i) {
      const auto& m = u.members[i];
      log << (i == 0 ? "" : ",") << "[" << m.worker << "," << m.tag << "," << m.computed_on << "]";
    }
    log << "]}\n";
  }
  const auto& st = aggregator.stats();
  std::ofstream(out + "/" + name + ".stats.json")
      << "{\"granted\":" << st.granted << ",\"summed\":" << st.summed << ",\"skipped\":" << st.skipped
      << ",\"forwarded\":" << st.forwarded << ",\"short_groups\":" << st.short_groups << ",\"lost\":" << st.lost
      << ",\"refused_doorbells\":" << st.refused_doorbells << ",\"peers_lost\":" << st.peers_lost
      << ",\"peers_left\":" << st.peers_left << ",\"peers_joined\":" << st.peers_joined
      << ",\"bytes_copied\":" << st.bytes_copied << "}\n";
  std::printf(
      "aggregator: forwarded %llu updates summing %llu (short groups %llu), skipped %llu, lost %llu, "
      "refused doorbells %llu, peers lost %llu, left %llu\n",
      static_cast<unsigned long long>(st.forwarded), static_cast<unsigned long long>(st.summed),
      static_cast<unsigned long long>(st.short_groups), static_cast<unsigned long long>(st.skipped),
      static_cast<unsigned long long>(st.lost), static_cast<unsigned long long>(st.refused_doorbells),
      static_cast<unsigned long long>(st.peers_lost), static_cast<unsigned long long>(st.peers_left));
  if (!aggregator.finished()) std::fprintf(stderr, "aggregator: timed out\n");
  return aggregator.finished() ? 0 : 3;
}

int run_worker(const Args& a) {
  if (a.values.contains("servers")) return run_sharded_worker(a);
  gradlane::ps::WorkerOptions options;
  options.id = static_cast<std::uint32_t>(a.number("id"));
  options.server = a.endpoint("server");
  if (a.values.contains("replica")) options.replica = a.endpoint("replica");
  if (a.values.contains("aggregator")) options.aggregator = a.endpoint("aggregator");
  options.mirror = a.number("replica_reads", 0) == 0;
  options.transport = gradlane::TransportOptions::from_env();
  options.floats = a.number("floats");
  if (a.values.contains("sidecar")) {                            // sidecar=SHM_NAME endpoint=ID server_endpoint=ID
    auto attach = gradlane::sidecar::AttachOptions::from_env();  // GRADLANE_SIDECAR_TIMEOUT_MS
    attach.shm_name = a.text("sidecar");
    attach.job = 1;
    attach.endpoint = static_cast<std::uint32_t>(a.number("endpoint"));
    options.sidecar = attach;
    options.server_endpoint = static_cast<std::uint32_t>(a.number("server_endpoint"));
  }
  options.grant_lifetime = std::chrono::milliseconds(a.number("grant_lifetime_ms", 1500));
  options.failover_patience = std::chrono::milliseconds(a.number("failover_patience_ms", 5000));
  // first_step=K: a restarted worker goes on from step K (membership: it rejoins the job).
  // pace_ms=M: M ms between steps (compute time), so a run lasts long enough for a restart.
  const std::uint64_t updates = a.number("updates"), die_after = a.number("die_after", ~0ull);
  const std::uint64_t first_step = a.number("first_step", 0), pace_ms = a.number("pace_ms", 0);
  const std::uint64_t stall_after = a.number("stall_after", ~0ull), stall_ms = a.number("stall_ms", 0);
  const bool uniform = a.text("gradient") == "uniform";

  gradlane::Device device = gradlane::Device::open({.name = a.text("device")});
  gradlane::ps::Worker worker(device, options);
  std::uint64_t torn = 0, retries = 0, last_version = 0, dropped = 0, lost = 0, expired = 0;
  std::string acked;        // the sequences of the pushes that succeeded (neither dropped nor lost)
  std::string acked_steps;  // the same, as [sequence, step]: what a sidecar-mode server cannot know
  std::string lost_steps;   // pushes reported lost that had a sequence, as [sequence, step]
  // Pushes an aggregator took: acknowledged once delivered, as [step, the server's sequence of
  // the sum]; or not delivered (its aggregator died first), as steps.
  std::string delivered, undelivered;
  const auto take_outcomes = [&] {
    for (const gradlane::ps::MemberOutcome& o : worker.take_member_outcomes()) {
      if (o.delivered) {
        delivered += (delivered.empty() ? "[" : ",[") + std::to_string(o.tag) + "," + std::to_string(o.sequence) + "]";
      } else {
        undelivered += (undelivered.empty() ? "" : ",") + std::to_string(o.tag);
      }
    }
  };
  // Written however the run ends: a worker that gave up (exit 1) still says what it acknowledged.
  const auto report = [&](bool settled, const std::string& error) {
    std::ofstream(a.text("out") + "/worker" + a.text("id") + ".json")
        << "{\"pushes\":" << updates << ",\"dropped\":" << dropped << ",\"lost\":" << lost << ",\"expired\":" << expired
        << ",\"delivered\":[" << delivered << "],\"undelivered\":[" << undelivered
        << "],\"unsettled\":" << (settled ? 0 : worker.members_pending()) << ",\"failovers\":" << worker.failovers()
        << ",\"bytes_copied\":" << worker.bytes_copied() << ",\"torn\":" << torn << ",\"pull_retries\":" << retries
        << ",\"acked\":[" << acked << "],\"acked_steps\":[" << acked_steps << "],\"lost_steps\":[" << lost_steps
        << "],\"error\":\"" << error << "\"}\n";
  };
  try {
    for (std::uint64_t step = first_step; step < updates; ++step) {
      if (pace_ms != 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
      const gradlane::ps::PullResult pulled = worker.pull();
      retries += pulled.attempts - 1;
      // Only a failover may take the version back (the replica may lag the dead server by a few).
      if (pulled.version < last_version && worker.failovers() == 0) {
        throw std::runtime_error("the model version went backwards");
      }
      last_version = pulled.version;
      if (uniform) {  // every consistent version is uniform; a torn read is not
        const auto model = worker.model();
        for (float x : model) torn += std::memcmp(&x, &model[0], sizeof x) != 0 ? 1 : 0;
      }
      auto gradient = worker.gradient();
      for (std::size_t j = 0; j < gradient.size(); ++j) gradient[j] = gradient_value(options.id, step, j, uniform);
      if (step == die_after) {
        // Ask for a slot and die before writing: the server must skip the hole, not stall. The
        // second lets the grant happen first (a server grants within milliseconds), so the dead
        // worker does hold a sequence number.
        worker.start_push(pulled.version, step);
        std::this_thread::sleep_for(1s);
        std::fflush(stdout);
        std::_Exit(9);
      }
      gradlane::ps::PushResult pushed;
      if (step == stall_after) {
        // Ask for a slot and stall before taking the grant up (a process stopped or descheduled
        // between the two): the grant may be older than the server's hole_timeout by then.
        worker.start_push(pulled.version, step);
        std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
        pushed = worker.wait_push();
      } else {
        pushed = worker.push(pulled.version, step);
      }
      expired += pushed.expired_grants;
      dropped += pushed.dropped ? 1 : 0;
      lost += pushed.lost ? 1 : 0;
      take_outcomes();
      if (pushed.lost && pushed.sequence != 0) {
        lost_steps +=
            (lost_steps.empty() ? "[" : ",[") + std::to_string(pushed.sequence) + "," + std::to_string(step) + "]";
      }
      if (!pushed.dropped && !pushed.lost && !pushed.pending) {
        acked += (acked.empty() ? "" : ",") + std::to_string(pushed.sequence);
        acked_steps +=
            (acked_steps.empty() ? "[" : ",[") + std::to_string(pushed.sequence) + "," + std::to_string(step) + "]";
      }
    }
  } catch (const gradlane::Error& e) {
    report(false, std::string(gradlane::errc_name(e.code())));
    throw;
  }
  const bool settled = worker.settle(30s);
  take_outcomes();
  report(settled, "");
  return torn == 0 ? 0 : 4;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    if (eq == std::string::npos) throw std::runtime_error("arguments are key=value, got " + arg);
    a.values[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  const std::string& role = a.text("role");
  if (role == "server") return run_shard(a, gradlane::ps::Role::server);
  if (role == "replica") return run_shard(a, gradlane::ps::Role::replica);
  if (role == "worker") return run_worker(a);
  if (role == "aggregator") return run_aggregator(a);
  throw std::runtime_error("role must be server, replica, worker or aggregator");
} catch (const std::exception& e) {
  std::fprintf(stderr, "ps_node: %s\n", e.what());
  return 1;
}
