// gradlane_ps_doorbells: how a receiver handles doorbells (zero-length WRITE_WITH_IMM, what
// every push ends with) from N worker connections, three ways (the scale of one server):
//   percq     each connection has its own completion queue and the loop polls every one of
//             them per round — a server without the shared queue
//   shared    one CompletionQueue for all connections: one poll per round, then only the
//             connections that got something are visited (as ShardServer does)
//   blocking  shared, and the loop sleeps in CompletionQueue::wait() when a round found nothing
//   srq       blocking, and every connection's receives come from one shared receive queue of
//             --shared-receives buffers instead of 128 each (ShardOptions::shared_receives)
//
//   gradlane_ps_doorbells --role server -d rxe0 -p 7950 --connections 8 --mode shared -n 4000
//   gradlane_ps_doorbells --role worker -d rxe1 --server 198.18.0.10:7950 --connections 8 -n 4000
//
// The worker opens N connections and rings n doorbells on each, round robin, at most --window
// unanswered per connection (the server returns credit every window/2). The server first runs
// its loop idle for --idle_ms with every connection open (what an idle receiver costs: CPU
// seconds per second), then says go and counts. Reported: doorbells/s, server CPU µs per
// doorbell (getrusage, user + system), idle CPU fraction. Public API only.
#include <gradlane/gradlane.hpp>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kName = "gradlane_ps_doorbells";

struct Options {
  std::string role, device, mode = "shared", server, out_json;
  std::uint16_t port = 7950;
  std::size_t connections = 1;
  std::uint64_t per_connection = 4000;
  std::uint32_t window = 64;
  std::uint32_t shared_receives = 512;
  int idle_ms = 1000;
  int timeout_s = 60;
};

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

std::span<const std::byte> bytes_of(const char* text) { return std::as_bytes(std::span(text, std::strlen(text))); }

// The receiver's loop, in the three ways. `take` gets each doorbell's connection index.
class Receiver {
 public:
  Receiver(std::vector<gradlane::Connection>& conns, std::optional<gradlane::CompletionQueue>& cq, std::string mode)
      : conns_(conns), cq_(cq), mode_(std::move(mode)) {}

  template <class Take>
  std::size_t round(Take take) {
    std::size_t got = 0;
    if (mode_ == "percq") {
      for (std::size_t i = 0; i < conns_.size(); ++i) {
        while (conns_[i].try_doorbell()) take(i), ++got;
        while (conns_[i].try_receive()) {
        }
      }
      return got;
    }
    cq_->poll();
    for (std::size_t i = 0; i < conns_.size(); ++i) {
      if (!conns_[i].has_pending_input()) continue;
      while (conns_[i].try_doorbell()) take(i), ++got;
      while (conns_[i].try_receive()) {
      }
    }
    if (got == 0 && (mode_ == "blocking" || mode_ == "srq")) cq_->wait(20ms);
    return got;
  }

 private:
  std::vector<gradlane::Connection>& conns_;
  std::optional<gradlane::CompletionQueue>& cq_;
  std::string mode_;
};

int server(const Options& o, const gradlane::Device& device) {
  const auto options = gradlane::TransportOptions::from_env();
  gradlane::Listener listener(device, o.port, options);
  std::optional<gradlane::CompletionQueue> cq;
  if (o.mode != "percq") {
    cq.emplace(device, 1024, o.mode == "srq" ? o.shared_receives : 0, options.max_message_bytes);
    listener.use_completion_queue(*cq);
  }
  gradlane::Buffer target = gradlane::Buffer::allocate(4096);
  const auto region = gradlane::MemoryRegion::register_buffer(device, target, gradlane::Access::remote_write);
  std::vector<gradlane::Connection> conns;
  for (std::size_t i = 0; i < o.connections; ++i) {
    conns.push_back(listener.accept(std::chrono::seconds(o.timeout_s)));
    conns.back().advertise(1, region.descriptor());
  }
  Receiver receiver(conns, cq, o.mode);
  // Idle: every connection open, nothing arriving.
  const double idle_cpu0 = cpu_seconds();
  const auto idle_start = Clock::now();
  while (Clock::now() - idle_start < std::chrono::milliseconds(o.idle_ms)) receiver.round([](std::size_t) {});
  const double idle_wall = std::chrono::duration<double>(Clock::now() - idle_start).count();
  const double idle_cpu = (cpu_seconds() - idle_cpu0) / idle_wall;

  for (auto& c : conns) c.send(bytes_of("go"));
  const std::uint64_t total = o.connections * o.per_connection;
  std::vector<std::uint64_t> per(o.connections, 0);
  std::uint64_t handled = 0;
  const double cpu0 = cpu_seconds();
  const auto start = Clock::now();
  auto last_progress = start;
  while (handled < total) {
    const std::size_t got = receiver.round([&](std::size_t i) {
      ++handled;
      if (++per[i] % (o.window / 2) == 0) conns[i].send(bytes_of("c"));  // credit
    });
    if (got != 0) {
      last_progress = Clock::now();
    } else if (Clock::now() - last_progress > std::chrono::seconds(o.timeout_s)) {
      std::fprintf(stderr, "%s: no doorbell for %d s after %llu of %llu\n", kName, o.timeout_s,
                   static_cast<unsigned long long>(handled), static_cast<unsigned long long>(total));
      return 1;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu = cpu_seconds() - cpu0;
  // The worker may still be flushing its last doorbells: leave only once each said it is done.
  for (auto& c : conns) c.send(bytes_of("done"));
  for (auto& c : conns) {
    while (c.receive(std::chrono::seconds(o.timeout_s)).size() != 3) {
    }  // "fin"
  }
  const double rate = static_cast<double>(total) / seconds;
  // Registered receive buffers: the shared queue knows; per-connection CQs keep depth × slot each.
  const std::uint64_t receive_bytes =
      cq ? cq->receive_buffer_bytes()
         : o.connections * std::uint64_t{options.recv_queue_depth} * (options.max_message_bytes + 12);
  std::printf(" connections  mode      doorbells  seconds  doorbells/s  cpu_us/doorbell  idle_cpu\n");
  std::printf(" %11zu  %-8s  %9llu  %7.3f  %11.0f  %15.2f  %8.2f\n", o.connections, o.mode.c_str(),
              static_cast<unsigned long long>(total), seconds, rate, cpu / static_cast<double>(total) * 1e6, idle_cpu);
  if (!o.out_json.empty()) {
    std::ofstream(o.out_json) << nlohmann::json{{"connections", o.connections},
                                                {"mode", o.mode},
                                                {"doorbells", total},
                                                {"seconds", seconds},
                                                {"doorbells_per_s", rate},
                                                {"cpu_s", cpu},
                                                {"cpu_us_per_doorbell", cpu / static_cast<double>(total) * 1e6},
                                                {"idle_cpu_fraction", idle_cpu},
                                                {"receive_buffer_bytes", receive_bytes}}
                                     .dump(2)
                              << '\n';
  }
  return 0;
}

int worker(const Options& o, const gradlane::Device& device) {
  const auto colon = o.server.rfind(':');
  const std::string address = o.server.substr(0, colon);
  const auto port = static_cast<std::uint16_t>(std::stoul(o.server.substr(colon + 1)));
  const auto options = gradlane::TransportOptions::from_env();
  std::vector<gradlane::Connection> conns;
  const auto give_up = Clock::now() + std::chrono::seconds(o.timeout_s);
  while (conns.size() < o.connections) {
    try {
      conns.push_back(gradlane::connect(device, address, port, options));
    } catch (const gradlane::Error& e) {
      if (e.code() != gradlane::Errc::connection_rejected || Clock::now() > give_up) throw;
      std::this_thread::sleep_for(50ms);
    }
  }
  gradlane::Buffer source = gradlane::Buffer::allocate(4096);
  const auto local = gradlane::MemoryRegion::register_buffer(device, source, gradlane::Access::local);
  std::vector<gradlane::RegionDescriptor> targets;
  for (auto& c : conns) targets.push_back(c.wait_region(1, std::chrono::seconds(o.timeout_s)));
  for (auto& c : conns)
    (void)c.receive(std::chrono::seconds(o.timeout_s) + std::chrono::milliseconds(o.idle_ms));  // go
  std::vector<std::uint64_t> credits(conns.size(), o.window), sent(conns.size(), 0);
  std::uint64_t left = o.connections * o.per_connection;
  while (left > 0) {
    for (std::size_t i = 0; i < conns.size(); ++i) {
      for (; credits[i] > 0 && sent[i] < o.per_connection; --credits[i], ++sent[i], --left) {
        conns[i].write_with_imm(local, 0, targets[i], 0, 0, static_cast<std::uint32_t>(sent[i]),
                                gradlane::Signal::automatic);
      }
      while (auto m = conns[i].try_receive()) credits[i] += o.window / 2;
    }
  }
  for (auto& c : conns) c.flush(std::chrono::seconds(o.timeout_s));
  for (auto& c : conns) {
    for (;;) {  // credits may still be queued before the server's "done"
      const auto m = c.receive(std::chrono::seconds(o.timeout_s));
      if (m.size() == 4) break;
    }
    c.wait(c.send(bytes_of("fin")), std::chrono::seconds(o.timeout_s));
  }
  std::printf("worker: %zu connections x %llu doorbells rung\n", conns.size(),
              static_cast<unsigned long long>(o.per_connection));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Doorbell handling of a receiver with N worker connections: per-connection CQs, one shared CQ, "
      "or a shared CQ with a blocking wait."};
  app.add_option("--role", o.role, "server | worker")->required()->check(CLI::IsMember({"server", "worker"}));
  app.add_option("-d,--ib-dev", o.device, "RDMA device (default: the only device)");
  app.add_option("-p,--port", o.port, "rdma_cm port (server)")->check(CLI::Range(1, 65535));
  app.add_option("--server", o.server, "the server, ADDR:PORT (worker)");
  app.add_option("--connections", o.connections, "worker connections")->check(CLI::Range(1, 256));
  app.add_option("--mode", o.mode, "server: percq | shared | blocking | srq")
      ->check(CLI::IsMember({"percq", "shared", "blocking", "srq"}));
  app.add_option("--shared-receives", o.shared_receives, "server, srq mode: buffers in the shared receive queue")
      ->check(CLI::Range(1U, 65536U));
  app.add_option("-n,--per-connection", o.per_connection, "doorbells per connection")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 32));
  app.add_option("--window", o.window, "unanswered doorbells per connection (≤ 128, the receive queue)")
      ->check(CLI::Range(2U, 128U));
  app.add_option("--idle_ms", o.idle_ms, "server: idle loop before go, to measure idle CPU")
      ->check(CLI::Range(0, 60000));
  app.add_option("--timeout", o.timeout_s, "seconds: bound on connects and on any wait without progress")
      ->check(CLI::Range(1, 3600));
  app.add_option("--out_json", o.out_json, "server: also write the results as JSON here");
  try {
    app.parse(argc, argv);
    if (o.role == "worker" && o.server.rfind(':') == std::string::npos) {
      throw CLI::ValidationError("--server", "the worker needs the server's ADDR:PORT");
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    gradlane::DeviceSelector selector = gradlane::DeviceSelector::from_env();
    if (!o.device.empty()) selector.name = o.device;
    const gradlane::Device device = gradlane::Device::open(selector);
    return o.role == "server" ? server(o, device) : worker(o, device);
  } catch (const gradlane::Error& e) {
    std::fprintf(stderr, "%s: %s\n", kName, e.what());
    return 1;
  }
}
