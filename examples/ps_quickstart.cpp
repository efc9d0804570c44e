// A parameter server, its replica and a worker on gradlane's ps API (direct mode, no sidecar).
//   replica:  ps_quickstart replica rxe1
//   server:   ps_quickstart server  rxe0 REPLICA_ADDRESS
//   worker:   ps_quickstart worker  rxe2 SERVER_ADDRESS REPLICA_ADDRESS
#include <gradlane/gradlane.hpp>

#include <cstdio>
#include <string>
#include <vector>

using namespace std::chrono_literals;

int main(int argc, char** argv) try {
  const std::string role = argc > 2 ? argv[1] : "";
  constexpr std::size_t kFloats = 1 << 16;  // one 256 KiB shard
  constexpr int kSteps = 20;
  gradlane::Device device = gradlane::Device::open({.name = argc > 2 ? argv[2] : ""});
  // The job's key (GRADLANE_JOB_KEY_FILE): without one this refuses to run (GRADLANE_INSECURE=1 overrides).
  const gradlane::TransportOptions transport = gradlane::TransportOptions::from_env();

  if (role == "server" || role == "replica") {
    gradlane::ps::ShardOptions shard;
    shard.floats = kFloats;
    shard.transport = transport;
    shard.learning_rate = 0.05F;
    const bool server = role == "server";
    const std::vector<float> initial(kFloats, 1.0F);
    gradlane::ps::ShardServer ps(device, server ? gradlane::ps::Role::server : gradlane::ps::Role::replica,
                                 server ? 7900 : 7901, shard, initial);
    if (server && argc > 3) ps.connect_replica(argv[3], 7901, 30s);  // every update is mirrored there
    ps.accept_peers(/*workers=*/1, 60s);
    ps.run_until(kSteps, 60s);  // applies the updates in sequence order
    std::printf("%s: version %llu, model[0] = %.2f\n", role.c_str(), static_cast<unsigned long long>(ps.version()),
                ps.model()[0]);
    return ps.version() == kSteps ? 0 : 1;
  }
  if (role == "worker" && argc > 3) {
    gradlane::ps::WorkerOptions options;
    options.server = {argv[3], 7900};
    options.floats = kFloats;
    options.transport = transport;
    if (argc > 4) options.replica = gradlane::ps::Endpoint{argv[4], 7901};
    gradlane::ps::Worker worker(device, options);
    for (int step = 0; step < kSteps; ++step) {
      const gradlane::ps::PullResult pulled = worker.pull();  // one-sided READs, never torn
      for (float& g : worker.gradient()) g = 0.5F;            // compute in registered memory
      worker.push(pulled.version, step);                      // request, grant, write + doorbell
    }
    std::printf("worker: pushed %d updates\n", kSteps);
    return 0;
  }
  std::fprintf(stderr, "usage: %s server|replica|worker DEVICE [ADDRESSES...]\n", argv[0]);
  return 2;
} catch (const gradlane::Error& e) {
  std::fprintf(stderr, "ps_quickstart: %s\n", e.what());
  return 1;
}
