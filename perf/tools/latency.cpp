// gradlane_write_lat / gradlane_read_lat: perftest's latency methods on the public API.
//
// write_lat (perftest's run_iter_lat_write): both sides RDMA-write into the other's buffer
// and busy-poll the last byte of their own; the byte carries the iteration number. Each side
// stamps its posts; the distance between successive stamps is one round trip, reported
// halved. Every write is signalled and its completion reaped before waiting for the peer,
// as perftest does.
//
// read_lat (perftest's run_iter_lat): the client posts one READ, polls until it completes,
// posts the next; successive stamps are one READ each, reported whole (perftest's
// rtt_factor is 1 for READ). The server only hosts the buffer.
#include <atomic>
#include <iostream>

#include <fmt/format.h>

#include "common/facts.hpp"
#include "common/report.hpp"
#include "common/session.hpp"
#include "common/ticks.hpp"
#include "common/tool.hpp"

namespace gradlane::perf {
namespace {

using Clock = std::chrono::steady_clock;

// Bounds a busy wait without reading the clock in the measured loop (HPET: ~1.35 µs per
// read in the VM): the deadline is set on the 2^16th spin and checked every 2^16 spins after
// (the bound stretches by those first spins, microseconds); the connection is polled every
// 2^10 spins so a failed peer surfaces as its Error instead of a silent spin.
class SpinGuard {
 public:
  SpinGuard(Connection& connection, std::chrono::milliseconds timeout, const char* what)
      : connection_(connection), timeout_(timeout), what_(what) {}
  void tick() {
    if ((++spins_ & 0x3ff) != 0) return;
    connection_.poll();
    if ((spins_ & 0xffff) != 0) return;
    const auto now = Clock::now();
    if (spins_ == 0x10000) deadline_ = now + timeout_;
    if (now > deadline_) {
      throw Error(Errc::timeout,
                  fmt::format("{} on {}: nothing arrived within --timeout", what_, connection_.describe()));
    }
  }

 private:
  Connection& connection_;
  std::chrono::milliseconds timeout_;
  Clock::time_point deadline_ = Clock::time_point::max();
  const char* what_;
  std::uint64_t spins_ = 0;
};

// Waits until this side's posted operations completed (the caller signalled the last one).
void reap(Connection& c, std::chrono::milliseconds timeout) {
  SpinGuard guard(c, timeout, "waiting for our own completion");
  while (c.outstanding() > 0) {
    c.poll();
    guard.tick();
  }
}

struct PingPong {
  Connection& connection;
  const MemoryRegion& local;  // [0, slot): what we send; [slot, 2·slot): where the peer writes
  RegionDescriptor remote;
  std::size_t slot;
  bool client;
  std::chrono::milliseconds timeout;

  // Runs `count` exchanges, continuing the byte counter from `base`; stamps each post.
  void run(std::size_t bytes, std::uint64_t base, std::uint64_t count, std::vector<Ticks>& stamps) {
    auto* out = reinterpret_cast<std::uint8_t*>(local.data()) + bytes - 1;
    auto* in = reinterpret_cast<std::uint8_t*>(local.data()) + slot + bytes - 1;
    std::atomic_ref<std::uint8_t> arrived(*in);
    std::atomic_ref<std::uint8_t> sending(*out);
    std::uint64_t sent = 0, received = 0;
    while (sent < count || received < count) {
      if (received < count && !(client && sent == 0)) {
        ++received;
        SpinGuard guard(connection, timeout, "waiting for the peer's write");
        while (arrived.load(std::memory_order_acquire) != static_cast<std::uint8_t>(base + received)) guard.tick();
      }
      if (sent < count) {
        stamps.push_back(now_ticks());
        ++sent;
        sending.store(static_cast<std::uint8_t>(base + sent), std::memory_order_release);
        connection.write(local, 0, remote, slot, bytes, Signal::always);
        reap(connection, timeout);
      }
    }
  }
};

// Deltas within each chunk only: the control-message handshake between chunks is not timed.
double chunked_average_usec(const std::vector<std::vector<Ticks>>& chunks, double unit, std::uint64_t& samples) {
  double sum = 0;
  samples = 0;
  for (const auto& c : chunks) {
    for (std::size_t i = 1; i < c.size(); ++i) sum += static_cast<double>(c[i] - c[i - 1]);
    samples += c.size() > 1 ? c.size() - 1 : 0;
  }
  return samples ? sum / static_cast<double>(samples) / unit : 0;
}

constexpr std::uint64_t kChunk = 100;  // -D: exchanges between two "more?" handshakes

int write_lat(const PerfOptions& o, Session& s, const TickRate& rate) {
  const RunPlan& plan = s.plan();
  const std::size_t slot = plan.max_size();
  const MemoryRegion& mr = s.register_buffer(2 * slot, Access::remote_write);
  RegionDescriptor remote;
  if (s.is_server()) {
    s.publish(mr);
    s.send_line("ready");
    remote = s.peer_region();
  } else {
    s.expect("ready");
    s.publish(mr);
    remote = s.peer_region();
  }
  const HeaderFacts facts = header_facts(o, s);
  const bool timed = plan.duration > 0;
  std::cout << header_block(facts) << (timed ? lat_duration_title() : lat_title()) << std::flush;
  nlohmann::json results = nlohmann::json::array();
  PingPong pp{s.control(), mr, remote, slot, !s.is_server(), s.timeout()};
  for (const std::size_t bytes : plan.sizes) {
    // Fresh zeros on both sides before the barrier: the first awaited counter value is 1.
    std::fill(mr.data(), mr.data() + mr.length(), std::byte{0});
    s.barrier(bytes);
    if (!timed) {
      std::vector<Ticks> stamps;
      stamps.reserve(plan.iterations);
      pp.run(bytes, 0, plan.iterations, stamps);
      const LatRow row = lat_row(bytes, plan.iterations, stamps, rate.ticks_per_usec(), 2);
      std::cout << lat_line(row) << std::flush;
      results.push_back(to_json(row));
      continue;
    }
    std::vector<std::vector<Ticks>> chunks;
    const auto stop_at = Clock::now() + std::chrono::seconds(plan.duration);
    for (std::uint64_t base = 0;; base += kChunk) {
      pp.run(bytes, base, kChunk, chunks.emplace_back());
      // The client alone decides when time is up, so both sides stop after the same chunk.
      bool stop = false;
      if (s.is_server()) {
        stop = s.receive_line(true) == "stop";
      } else {
        stop = Clock::now() >= stop_at;
        s.send_line(stop ? "stop" : "more");
      }
      if (stop) break;
    }
    std::uint64_t samples = 0;
    const double avg = chunked_average_usec(chunks, rate.ticks_per_usec() * 2, samples);
    std::cout << lat_duration_line(bytes, samples, avg) << std::flush;
    results.push_back({{"MsgSize", bytes}, {"n_iterations", samples}, {"t_avg", avg}});
  }
  s.finish();
  std::cout << kResultLine;
  if (o.json_file) write_json_file(*o.json_file, {{"test_info", test_info_json(facts)}, {"results", results}});
  return 0;
}

int read_lat(const PerfOptions& o, Session& s, const TickRate& rate) {
  const RunPlan& plan = s.plan();
  const bool timed = plan.duration > 0;
  const MemoryRegion& mr =
      s.register_buffer(plan.max_size(), s.is_server() ? Access::remote_read : Access::local_write);
  RegionDescriptor remote;
  if (s.is_server()) {
    s.publish(mr);
    s.send_line("ready");
  } else {
    s.expect("ready");
    remote = s.peer_region();
  }
  const HeaderFacts facts = header_facts(o, s);
  std::cout << header_block(facts) << (timed ? lat_duration_title() : lat_title()) << std::flush;
  nlohmann::json results = nlohmann::json::array();
  for (const std::size_t bytes : plan.sizes) {
    s.barrier(bytes);
    if (s.is_server()) {
      const std::string line = s.expect("result");
      std::cout << line << '\n' << std::flush;
      if (auto row = parse_lat_line(line)) results.push_back(to_json(*row));
      continue;
    }
    Connection& c = s.control();
    std::vector<Ticks> stamps;
    const auto stop_at = Clock::now() + std::chrono::seconds(plan.duration);
    for (std::uint64_t i = 0; timed || i < plan.iterations; ++i) {
      if (timed && i % 64 == 0 && Clock::now() >= stop_at) break;
      stamps.push_back(now_ticks());
      c.read(mr, 0, remote, 0, bytes);
      reap(c, s.timeout());
    }
    std::string line;
    if (timed) {
      std::uint64_t samples = 0;
      const double avg = chunked_average_usec({stamps}, rate.ticks_per_usec(), samples);
      line = lat_duration_line(bytes, samples, avg);
      results.push_back({{"MsgSize", bytes}, {"n_iterations", samples}, {"t_avg", avg}});
    } else {
      const LatRow row = lat_row(bytes, plan.iterations, stamps, rate.ticks_per_usec(), 1);
      line = lat_line(row);
      results.push_back(to_json(row));
    }
    std::cout << line << std::flush;
    line.pop_back();
    s.send_line("result " + line);
  }
  s.finish();
  std::cout << kResultLine;
  if (o.json_file) write_json_file(*o.json_file, {{"test_info", test_info_json(facts)}, {"results", results}});
  return 0;
}

}  // namespace

int latency_main(const ToolKind& kind, int argc, char** argv) {
  const PerfOptions o = parse_options(kind, argc, argv);
  return guarded(kind.name, [&] {
    const TickRate rate;
    Session s = Session::establish(o);
    return kind.verb == Verb::write ? write_lat(o, s, rate) : read_lat(o, s, rate);
  });
}

}  // namespace gradlane::perf
