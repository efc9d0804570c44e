// sidecar_push: gradient pushes scheduled by gradlaned, end to end.
//
//   sidecar_push server DEVICE PORT SLOT_BYTES TOTAL_UPDATES WORKERS
//     Registers TOTAL_UPDATES slots of SLOT_BYTES, accepts WORKERS workers, and applies updates
//     in sequence order (an update whose predecessor has not arrived yet waits).
//   sidecar_push worker NAME SHM JOB ENDPOINT DEVICE SERVER_ADDR PORT RECEIVER SLOT_BYTES UPDATES
//     Attaches to the gradlaned serving SHM as job JOB on NIC ENDPOINT, asks it for UPDATES
//     pushes to receiver endpoint RECEIVER, and for each grant waits for the slot, writes the
//     payload into slot SEQ-1 of the server's region followed by a WRITE_WITH_IMM doorbell
//     carrying SEQ, and reports completion.
//
// Both print what happens and, when GRADLANE_OUT_DIR is set, write it as JSON lines to
// $GRADLANE_OUT_DIR/NAME.jsonl (the softroce tests check the schedule from them).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gradlane/gradlane.hpp"
#include "gradlane/sidecar.hpp"

namespace {

using namespace gradlane;

// The payload of update SEQ: a byte pattern the server can verify without a copy alongside.
std::byte payload_byte(std::uint64_t seq, std::size_t i) {
  return static_cast<std::byte>((seq * 131 + i * 7 + (i >> 8)) & 0xff);
}
void fill_payload(std::span<std::byte> out, std::uint64_t seq) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = payload_byte(seq, i);
}
bool payload_intact(std::span<const std::byte> in, std::uint64_t seq) {
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != payload_byte(seq, i)) return false;
  }
  return true;
}

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::int64_t now_ns() { return Clock::now().time_since_epoch().count(); }

// JSON lines to $GRADLANE_OUT_DIR/NAME.jsonl when that is set.
struct Report {
  std::FILE* file = nullptr;
  explicit Report(const std::string& name) {
    if (const char* dir = std::getenv("GRADLANE_OUT_DIR")) {
      file = std::fopen(fmt::format("{}/{}.jsonl", dir, name).c_str(), "w");
      if (file == nullptr) throw std::runtime_error("cannot write report " + name);
    }
  }
  ~Report() {
    if (file) std::fclose(file);
  }
  Report(const Report&) = delete;
  Report& operator=(const Report&) = delete;
  void line(const std::string& s) {
    if (!file) return;
    std::fputs((s + "\n").c_str(), file);
    std::fflush(file);
  }
};

Device open_device(const std::string& name) {
  DeviceSelector s;
  s.name = name;
  return Device::open(s);
}

int server(char** argv) {
  Device device = open_device(argv[0]);
  const auto port = static_cast<std::uint16_t>(std::stoul(argv[1]));
  const std::size_t slot = std::stoull(argv[2]);
  const std::size_t total = std::stoull(argv[3]);
  const std::size_t connections = std::stoull(argv[4]);
  Buffer buffer = Buffer::allocate(slot * total);
  MemoryRegion region = MemoryRegion::register_buffer(device, buffer, Access::remote_write);
  Listener listener(device, port, TransportOptions::from_env());  // the job key
  std::vector<Connection> workers;
  for (std::size_t i = 0; i < connections; ++i) {
    workers.push_back(listener.accept(120s));
    workers.back().advertise(1, region.descriptor());
  }
  Report report("server");
  // A parameter server applies updates in sequence order: an update that arrives before its
  // predecessor (its sender started on time, the predecessor's sender ran late) waits.
  std::vector<bool> arrived(total + 1, false);
  std::uint64_t next_to_apply = 1;
  std::size_t seen = 0;
  const auto deadline = Clock::now() + 300s;
  while (seen < total && Clock::now() < deadline) {
    bool any = false;
    for (auto& w : workers) {
      if (w.failed()) continue;  // a worker that sent everything and left
      std::optional<Doorbell> bell;
      try {
        bell = w.try_doorbell();
      } catch (const Error& e) {
        if (e.code() != Errc::peer_gone) throw;
        continue;
      }
      if (bell) {
        any = true;
        const std::int64_t at = now_ns();
        const std::uint64_t seq = bell->imm;
        bool ok = seq >= 1 && seq <= total && !arrived[seq];
        if (ok) ok = payload_intact({buffer.data() + (seq - 1) * slot, slot}, seq);
        if (ok) arrived[seq] = true;
        report.line(fmt::format(R"({{"event":"arrived","seq":{},"at":{},"payload_ok":{}}})", seq, at, ok));
        ++seen;
        while (next_to_apply <= total && arrived[next_to_apply]) {
          report.line(fmt::format(R"({{"event":"applied","seq":{},"at":{}}})", next_to_apply, now_ns()));
          std::printf("server: applied update %llu\n", static_cast<unsigned long long>(next_to_apply));
          ++next_to_apply;
        }
      }
    }
    // Six processes share the VM's two vCPUs: don't let an idle poll loop starve the senders.
    if (!any) std::this_thread::yield();
  }
  return seen == total && next_to_apply == total + 1 ? 0 : 1;
}

int worker(char** argv) {
  const std::string name = argv[0];
  sidecar::AttachOptions options = sidecar::AttachOptions::from_env();
  options.shm_name = argv[1];
  options.job = static_cast<std::uint32_t>(std::stoul(argv[2]));
  options.endpoint = static_cast<std::uint32_t>(std::stoul(argv[3]));
  Device device = open_device(argv[4]);
  const std::string server_addr = argv[5];
  const auto port = static_cast<std::uint16_t>(std::stoul(argv[6]));
  const auto receiver = static_cast<std::uint32_t>(std::stoul(argv[7]));
  const std::size_t slot = std::stoull(argv[8]);
  const std::size_t updates = std::stoull(argv[9]);
  options.region_bytes = slot;
  options.attach_timeout = 30s;

  Buffer buffer = Buffer::allocate(slot);
  MemoryRegion source = MemoryRegion::register_buffer(device, buffer, Access::local);
  std::optional<Connection> conn;
  TransportOptions transport = TransportOptions::from_env();  // the job key
  transport.connect_timeout = 20s;  // ARP across the emulated bridge is slow when the VM is busy
  for (int attempt = 0; !conn; ++attempt) {
    try {
      conn = connect(device, server_addr, port, transport);
    } catch (const Error& e) {
      const bool server_starting = e.code() == Errc::connection_rejected || e.code() == Errc::unreachable;
      if (!server_starting || attempt > 600) throw;
      std::this_thread::sleep_for(50ms);
    }
  }
  const RegionDescriptor target = conn->wait_region(1, 60s);
  auto client = sidecar::Client::attach(options);
  Report report(name);
  for (std::size_t i = 0; i < updates; ++i) {
    const std::int64_t asked = now_ns();
    const auto id = client.request({.tensor = static_cast<std::uint32_t>(i),
                                    .receiver = receiver,
                                    .bytes = slot,
                                    .region_offset = 0,
                                    .computed_on = 0,
                                    .gradient_norm = 1.0F,
                                    .priority = 0});
    const sidecar::Grant grant = client.wait(60s);
    if (grant.request != id || grant.kind != sidecar::GrantKind::go || grant.part_count != 1) {
      std::fprintf(stderr, "%s: unexpected answer kind %s reason %s for request %llu\n", name.c_str(),
                   std::string(sidecar::kind_name(grant.kind)).c_str(),
                   std::string(sidecar::reason_name(grant.reason)).c_str(), static_cast<unsigned long long>(id));
      return 1;
    }
    const std::uint64_t seq = grant.sequence;
    fill_payload(buffer.bytes(), seq);
    // The slot is the receiver's clear-to-send: not before its start. Sleep most of the wait
    // (other processes share the CPU), spin the last 100 µs.
    std::this_thread::sleep_until(Clock::time_point(grant.slot_start - 100us));
    while (now_ns() < grant.slot_start.count()) {
    }
    const std::int64_t started = now_ns();
    conn->write(source, 0, target, (seq - 1) * slot, slot - 8);
    conn->wait(
        conn->write_with_imm(source, slot - 8, target, (seq - 1) * slot + slot - 8, 8, static_cast<std::uint32_t>(seq)),
        60s);
    const std::int64_t done = now_ns();
    client.complete(id, grant.part_index, std::chrono::nanoseconds(done - started));
    std::printf("%s: job %u update %zu: granted seq %llu, slot +%.2f ms for %.2f ms, sent in %.2f ms\n", name.c_str(),
                options.job, i, static_cast<unsigned long long>(seq), (grant.slot_start.count() - asked) / 1e6,
                grant.slot_length.count() / 1e6, (done - started) / 1e6);
    report.line(fmt::format(R"({{"seq":{},"slot_start":{},"slot_end":{},"started":{},"done":{}}})", seq,
                            grant.slot_start.count(), grant.slot_start.count() + grant.slot_length.count(), started,
                            done));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string role = argc > 1 ? argv[1] : "";
    if (role == "server" && argc == 7) return server(argv + 2);
    if (role == "worker" && argc == 12) return worker(argv + 2);
    std::fprintf(stderr,
                 "usage: %s server DEVICE PORT SLOT_BYTES TOTAL_UPDATES WORKERS\n"
                 "       %s worker NAME SHM JOB ENDPOINT DEVICE SERVER_ADDR PORT RECEIVER SLOT_BYTES UPDATES\n",
                 argv[0], argv[0]);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sidecar_push %s: %s\n", argc > 1 ? argv[1] : "", e.what());
    return 3;
  }
}
