// One run of a perftest-style tool: the connections, the buffers and the tiny handshake that
// keeps both processes in step.
//
// Setup is gradlane's own: rdma_cm through Listener / connect (-p), the server's buffer
// published with Connection::advertise and learnt with wait_region. Everything else travels as
// short text lines in SEND/RECV control messages on QP 0:
//
//   client → server  "hello 1 <test> qps=Q iters=N duration=D tx=T cqmod=M sizes=S1,S2,…"
//                    The client's parameters rule: the server adopts them (a server started
//                    without -s/-n still runs what the client asks), and refuses another test.
//   server → client  "ready" once its buffer is registered and advertised as region 1 on
//                    every QP, or "error <why>".
//   client → server  (write_lat only) its own buffer, advertised as region 1: both sides write.
//   per size, both   "sync <bytes>": a barrier, each side sends it and waits for the other's,
//                    so a measurement never starts before the peer is ready for it.
//   client → server  "result <line>": the client's report line, which the server prints too
//                    (as perftest's server does). write_lat sides each report their own.
//   client → server  "bye", answered by "bye": teardown in a known order.
//
// Waits that do not measure anything sleep between polls instead of spinning: perftest's
// passive side sleeps in a socket read, and a spinning bystander would take a CPU from rxe's
// kernel threads on a 2-vCPU VM.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <deque>
#include <vector>

#include "common/options.hpp"
#include "gradlane/gradlane.hpp"

namespace gradlane::perf {

// What both sides run, as agreed in the hello.
struct RunPlan {
  std::string test;
  int qps = 1;
  std::uint64_t iterations = 0;
  int duration = 0;
  int tx_depth = 1;
  int cq_mod = 0;  // 0 = perftest's rule per size
  std::vector<std::size_t> sizes;

  std::string to_hello() const;
  static RunPlan from_hello(const std::string& line);  // throws Error(protocol)
  std::size_t max_size() const;
};

class Session {
 public:
  // Server: listens on -p, waits up to --timeout for a client and adopts its plan.
  // Client: connects (retrying until the server is up, bounded by --timeout) and sends its plan.
  static Session establish(const PerfOptions& options);

  Session(Session&&) noexcept = default;
  Session& operator=(Session&&) noexcept = default;
  ~Session();

  bool is_server() const { return server_; }
  const Device& device() const { return device_; }
  const RunPlan& plan() const { return plan_; }
  Connection& control() { return connections_.front(); }
  std::vector<Connection>& connections() { return connections_; }
  const TransportOptions& transport() const { return connections_.front().options(); }

  // Registers `bytes` of local memory with `access` and, if `publish`, advertises it as region
  // 1 on every QP. The buffer lives as long as the session.
  const MemoryRegion& register_buffer(std::size_t bytes, Access access);
  void publish(const MemoryRegion& region);
  // The peer's region 1 on QP `qp`.
  RegionDescriptor peer_region(std::size_t qp = 0);

  void send_line(const std::string& line);
  // The next control line, within --timeout. Sleeps between polls unless `spin`.
  std::string receive_line(bool spin = false);
  // Expects a line starting with `word`; returns the rest. A peer's "error <why>" throws.
  std::string expect(const std::string& word, bool spin = false);
  void barrier(std::size_t bytes);
  // Exchanges "bye" so both sides tear down in a known order.
  void finish();

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  Session(Device device, bool server, std::chrono::milliseconds timeout)
      : device_(std::move(device)), server_(server), timeout_(timeout) {}

  Device device_;
  bool server_;
  std::chrono::milliseconds timeout_;
  std::optional<Listener> listener_;
  std::vector<Connection> connections_;
  RunPlan plan_;
  std::deque<Buffer> buffers_;        // deques: references handed out stay valid
  std::deque<MemoryRegion> regions_;  // after buffers_: deregistered before unmapped
  bool finished_ = false;
};

}  // namespace gradlane::perf
