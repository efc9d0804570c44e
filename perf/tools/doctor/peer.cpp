// gradlane_doctor's peer checks: rdma_cm reachability, then one verified RDMA WRITE in each
// direction, through gradlane's public API only (what a job would do at start-up).
//
// Exchange (control messages on the one connection):
//   both          advertise a receive buffer as region 1, learn the other's
//   client        WRITEs a pattern into the server's buffer, then "check SEED"
//   server        verifies it → "ok" | "mismatch at BYTE"; WRITEs its own pattern back, "check SEED"
//   client        verifies it → "ok" | "mismatch at BYTE"; "bye" → "bye"
#include <chrono>
#include <iostream>
#include <thread>

#include <fmt/format.h>

#include "doctor/checks.hpp"

namespace gradlane::doctor {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::byte pattern_byte(std::uint64_t seed, std::size_t i) {
  return static_cast<std::byte>((seed * 131 + i * 7 + (i >> 8)) & 0xff);
}

void fill(std::span<std::byte> bytes, std::uint64_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern_byte(seed, i);
}

std::string verify(std::span<const std::byte> bytes, std::uint64_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != pattern_byte(seed, i)) return fmt::format("mismatch at byte {}", i);
  }
  return "ok";
}

void send_text(Connection& c, const std::string& text) { c.send(std::as_bytes(std::span(text))); }
std::string receive_text(Connection& c, Millis timeout) {
  const auto bytes = c.receive(timeout);
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::string connect_fix(Errc code, const DoctorOptions& o, const DeviceInfo& info) {
  switch (code) {
    case Errc::address_unresolved:
      return fmt::format(
          "{} is not reachable from {} ({}): check the address, and that the peer's address is on the "
          "RDMA network (not its management interface)",
          o.peer, info.name, info.ipv4_address);
    case Errc::route_unresolved:
      return fmt::format("no route from {} to {}: put both on one subnet or add a route over the RDMA interface",
                         info.ipv4_address, o.peer);
    case Errc::connection_rejected:
      return fmt::format("nothing listens at {}:{}: start `gradlane_doctor -p {}` (no address) on the peer first",
                         o.peer, o.port, o.port);
    case Errc::invalid_argument:
      return "the address belongs to another RDMA device: select the device that owns the route (-d)";
    default:
      return fmt::format(
          "the peer did not answer: wrong address, peer down, or a firewall dropping RoCE v2 (UDP "
          "4791) between {} and {}",
          info.ipv4_address, o.peer);
  }
}

Connection connect_until(const Device& device, const DoctorOptions& o, const TransportOptions& t) {
  const auto deadline = Clock::now() + std::chrono::seconds(o.timeout);
  for (;;) {
    try {
      return connect(device, o.peer, o.port, t);
    } catch (const Error& e) {
      const bool not_up_yet = e.code() == Errc::connection_rejected;
      if (!not_up_yet || Clock::now() + 200ms > deadline) throw;
      std::this_thread::sleep_for(200ms);  // the doctor server may still be starting
    }
  }
}

}  // namespace

void check_peer(const DoctorOptions& o, const Device& device, Report& report) {
  const Millis timeout(std::int64_t{o.timeout} * 1000);
  TransportOptions t = TransportOptions::from_env();
  t.connect_timeout = std::min<Millis>(timeout, 20s);
  const bool server = o.peer.empty();

  Buffer inbox = Buffer::allocate(o.bytes);
  Buffer outbox = Buffer::allocate(o.bytes);
  std::optional<MemoryRegion> in_mr, out_mr;
  try {
    in_mr = MemoryRegion::register_buffer(device, inbox, Access::remote_write);
    out_mr = MemoryRegion::register_buffer(device, outbox, Access::local);
  } catch (const Error& e) {
    report.add(Status::fail, "registration", e.what(), "see the memlock finding above");
    return;
  }

  std::optional<Connection> conn;
  const auto t0 = Clock::now();
  if (server) {
    try {
      Listener listener(device, o.port, t);
      std::cout << fmt::format("       waiting up to {} s for `gradlane_doctor {}` on the peer ...\n", o.timeout,
                               listener.address())
                << std::flush;
      conn.emplace(listener.accept(timeout));
    } catch (const Error& e) {
      report.add(Status::fail, "rdma_cm", e.what(),
                 e.code() == Errc::timeout
                     ? fmt::format("run `gradlane_doctor {}` on the peer; if it cannot connect, its doctor says why",
                                   device.info().ipv4_address)
                     : "another process may own the port: choose another with -p");
      return;
    }
  } else {
    try {
      conn.emplace(connect_until(device, o, t));
    } catch (const Error& e) {
      report.add(Status::fail, "rdma_cm", e.what(), connect_fix(e.code(), o, device.info()));
      return;
    }
  }
  const auto setup_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  Connection& c = *conn;
  if (server) {
    report.add(Status::ok, "rdma_cm", fmt::format("peer connected: {}", c.describe()));
  } else {
    report.add(Status::ok, "rdma_cm", fmt::format("connected in {} ms: {}", setup_ms, c.describe()));
    if (setup_ms > 2000) {
      report.add(Status::warn, "start-up", fmt::format("connection setup took {} ms", setup_ms),
                 "slow ARP/neighbour resolution or a peer that started late; a hang here in a job is the same cause");
    }
  }

  try {
    c.advertise(1, in_mr->descriptor());
    const RegionDescriptor remote = c.wait_region(1, timeout);
    auto push = [&](std::uint64_t seed) {
      fill(outbox.bytes(), seed);
      c.wait(c.write(*out_mr, 0, remote, 0, o.bytes, Signal::always), timeout);
      send_text(c, fmt::format("check {}", seed));
    };
    auto check_incoming = [&]() {
      const std::string line = receive_text(c, timeout);
      const std::uint64_t seed = std::stoull(line.substr(line.find(' ') + 1));
      const std::string verdict = verify(inbox.bytes(), seed);
      send_text(c, verdict);
      return verdict;
    };
    const std::string here_to_there = server ? "server → client" : "client → server";
    const std::string there_to_here = server ? "client → server" : "server → client";
    if (!server) push(1);
    if (server) {
      const std::string verdict = check_incoming();
      report.add(verdict == "ok" ? Status::ok : Status::fail, "write " + there_to_here,
                 fmt::format("{} bytes RDMA-written by the peer: {}", o.bytes, verdict),
                 verdict == "ok" ? "" : "data corruption: report it with this output");
    } else {
      const std::string verdict = receive_text(c, timeout);
      report.add(verdict == "ok" ? Status::ok : Status::fail, "write " + here_to_there,
                 fmt::format("{} bytes written, verified by the peer: {}", o.bytes, verdict),
                 verdict == "ok" ? "" : "data corruption: report it with this output");
    }
    if (server) push(2);
    if (server) {
      const std::string verdict = receive_text(c, timeout);
      report.add(verdict == "ok" ? Status::ok : Status::fail, "write " + here_to_there,
                 fmt::format("{} bytes written, verified by the peer: {}", o.bytes, verdict),
                 verdict == "ok" ? "" : "data corruption: report it with this output");
      if (receive_text(c, timeout) == "bye") send_text(c, "bye");
      c.flush(timeout);
    } else {
      const std::string verdict = check_incoming();
      report.add(verdict == "ok" ? Status::ok : Status::fail, "write " + there_to_here,
                 fmt::format("{} bytes RDMA-written by the peer: {}", o.bytes, verdict),
                 verdict == "ok" ? "" : "data corruption: report it with this output");
      send_text(c, "bye");
      (void)receive_text(c, timeout);
    }
  } catch (const Error& e) {
    report.add(Status::fail, "exchange", fmt::format("{}: {}", errc_name(e.code()), e.what()),
               e.code() == Errc::remote_access ? "the peer's NIC refused the access: mismatched registration or rkey"
               : e.code() == Errc::timeout     ? "the peer stopped answering: check its doctor output"
                                               : "see the message; RoCE: check PFC/ECN and that UDP 4791 passes");
  }
}

}  // namespace gradlane::doctor
