// Push one 4 MiB gradient update into a server's registered region, zero-copy.
//   server:  push_update rxe0
//   worker:  push_update rxe0 198.18.0.1
#include <gradlane/gradlane.hpp>

#include <cstdio>
#include <thread>

using namespace std::chrono_literals;

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DEVICE [SERVER_ADDRESS]\n", argv[0]);
    return 2;
  }
  constexpr std::size_t kFloats = 1 << 20, kBytes = kFloats * sizeof(float);
  constexpr std::uint16_t kPort = 7471;
  gradlane::check_memlock(kBytes);  // fails early, saying how to raise the limit
  gradlane::Device device = gradlane::Device::open({.name = argv[1]});
  // The job's key (GRADLANE_JOB_KEY_FILE): without one this refuses to run (GRADLANE_INSECURE=1 overrides).
  const gradlane::TransportOptions options = gradlane::TransportOptions::from_env();
  gradlane::Buffer buffer = gradlane::Buffer::allocate(kBytes);  // page-aligned, hugepages if free
  auto* gradient = reinterpret_cast<float*>(buffer.data());

  if (argc == 2) {  // server: owns the region that updates are written into
    auto region = gradlane::MemoryRegion::register_buffer(device, buffer, gradlane::Access::remote_write);
    gradlane::Listener listener(device, kPort, options);
    gradlane::Connection worker = listener.accept(60s);
    worker.advertise(/*region id=*/1, region.descriptor());     // once per (region, peer)
    const gradlane::Doorbell bell = worker.wait_doorbell(60s);  // payload is in place when it rings
    double sum = 0;
    for (std::size_t i = 0; i < kFloats; ++i) sum += gradient[i];
    std::printf("server: update %u arrived, sum of %zu floats = %.1f\n", bell.imm, kFloats, sum);
    return sum == 0.5 * kFloats ? 0 : 1;
  }

  // worker: the gradient is computed in place in registered memory; nothing is copied.
  for (std::size_t i = 0; i < kFloats; ++i) gradient[i] = 0.5f;
  auto source = gradlane::MemoryRegion::register_buffer(device, buffer, gradlane::Access::local);
  std::optional<gradlane::Connection> server;
  for (int attempt = 0; !server; ++attempt) {  // the server may still be starting
    try {
      server = gradlane::connect(device, argv[2], kPort, options);
    } catch (const gradlane::Error& e) {
      if (e.code() != gradlane::Errc::connection_rejected || attempt == 100) throw;
      std::this_thread::sleep_for(100ms);
    }
  }
  const gradlane::RegionDescriptor target = server->wait_region(1, 10s);
  // The payload goes unsignalled; the last 4 bytes ride a WRITE_WITH_IMM doorbell naming the
  // update. RC ordering places the payload before the doorbell completes at the server.
  server->write(source, 0, target, 0, kBytes - 4);
  server->wait(server->write_with_imm(source, kBytes - 4, target, kBytes - 4, 4, /*imm=*/42), 10s);
  std::printf("worker: pushed %zu bytes to %s\n", kBytes, server->describe().c_str());
  return 0;
} catch (const gradlane::Error& e) {
  std::fprintf(stderr, "push_update: %s\n", e.what());
  return 1;
}
