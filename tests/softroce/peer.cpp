// The peer process of the softroce suite: connects to the test, registers one region,
// advertises it as region 1, then runs text commands until "exit" or until its connection
// fails. Exit status: 0 after "exit"; 10 when a connection failed (the test decides whether
// that was expected); 2 for bad arguments; 3 for an unexpected error.
//
// Commands (one control message each, one reply each):
//   verify OFF LEN SEED     check region[OFF, OFF+LEN) byte for byte → "ok" | "mismatch ..."
//   fill OFF LEN SEED       write the pattern into the region (for the test to READ) → "ok"
//   doorbells N SLOT SLOTS  receive N WRITE_WITH_IMM doorbells; doorbell i must carry imm i and
//                           slot i % SLOTS (SLOT bytes each) must already hold pattern seed i;
//                           sends "credit" after every SLOTS doorbells → "ok N" | error
//   echo BYTES              reply with BYTES verbatim (SEND/RECV round trip)
//   push ID OFF LEN SEED    RDMA WRITE pattern SEED from our region into the test's region ID
//                           at OFF (waits for its completion) → "ok"
//   burst N ID TAG          N pattern-TAG+i payloads of 64 bytes, each WRITTEN into the test's
//                           region ID at i*64 with a doorbell (imm TAG+i), then N messages
//                           "TAG+i", all posted back to back without waiting → "sent N" (a
//                           burst for a shared receive queue)
//   connect_again           open a second connection to the same listener (region 1 again)
//   write K ADDR RKEY LEN SEED  RDMA WRITE pattern SEED (LEN bytes from our region) to the raw
//                           remote (ADDR, RKEY) over our K-th connection (0 = the first) and
//                           wait → "ok" | "refused ERRC: MESSAGE" when the write failed that
//                           connection (the others carry on: a rogue writer's probe)
// Other roles: `--peer memlock` (the memlock scenario), `--peer half-open ADDRESS PORT` (a
// connect request whose handshake never completes).
//   exit                    → "bye", exit 0
#include <arpa/inet.h>
#include <linux/capability.h>
#include <rdma/rdma_cma.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/pattern.hpp"
#include "harness.hpp"

namespace gradlane::testing {
namespace {

void reply(Connection& c, const std::string& s) { send_text(c, s); }

struct Peer {
  Device device;
  std::string address;
  std::uint16_t port;
  Buffer buffer;
  MemoryRegion region;
  std::deque<Connection> connections;  // deque: push_back keeps references to the others valid

  Peer(Device dev, std::string addr, std::uint16_t p, std::size_t bytes)
      : device(std::move(dev)),
        address(std::move(addr)),
        port(p),
        buffer(Buffer::allocate(bytes)),
        region(MemoryRegion::register_buffer(device, buffer, Access::remote_write | Access::remote_read)) {}

  void connect_once() {
    // Retries while nothing listens yet: some tests start the peer before their listener.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      try {
        connections.push_back(connect(device, address, port, test_options()));
        break;
      } catch (const Error& e) {
        if (e.code() != Errc::connection_rejected || std::chrono::steady_clock::now() > give_up) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    connections.back().advertise(1, region.descriptor());
  }

  std::string run(Connection& c, const std::string& line) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    if (verb == "verify" || verb == "fill") {
      std::uint64_t off = 0, len = 0, seed = 0;
      in >> off >> len >> seed;
      if (!region.contains(off, len)) return "bad range";
      std::span<std::byte> bytes(buffer.data() + off, len);
      if (verb == "fill") {
        fill_pattern(bytes, seed);
        return "ok";
      }
      return check_pattern(bytes, seed).value_or("ok");
    }
    if (verb == "doorbells") {
      std::uint64_t n = 0, slot = 0, slots = 0;
      in >> n >> slot >> slots;
      if (slots == 0 || slot * slots > buffer.size()) return "bad doorbells arguments";
      for (std::uint64_t i = 0; i < n; ++i) {
        const Doorbell d = c.wait_doorbell(std::chrono::seconds(30));
        if (d.imm != static_cast<std::uint32_t>(i))
          return "doorbell " + std::to_string(i) + " carried imm " + std::to_string(d.imm);
        std::span<const std::byte> payload(buffer.data() + (i % slots) * slot, slot);
        if (auto bad = check_pattern(payload, i))
          return "payload of doorbell " + std::to_string(i) + " not in place: " + *bad;
        if ((i + 1) % slots == 0) reply(c, "credit");
      }
      return "ok " + std::to_string(n);
    }
    if (verb == "echo") return line.size() > 5 ? line.substr(5) : std::string();
    if (verb == "push") {
      std::uint32_t id = 0;
      std::uint64_t off = 0, len = 0, seed = 0;
      in >> id >> off >> len >> seed;
      if (!region.contains(0, len)) return "bad length";
      fill_pattern({buffer.data(), len}, seed);
      const RegionDescriptor target = c.wait_region(id, std::chrono::seconds(30));
      c.wait(c.write(region, 0, target, off, len, Signal::always), std::chrono::seconds(30));
      return "ok";
    }
    if (verb == "write") {
      std::size_t k = 0;
      RegionDescriptor target;
      std::uint64_t seed = 0;
      in >> k >> target.addr >> target.rkey >> target.length >> seed;
      if (k >= connections.size() || !region.contains(0, target.length)) return "bad write arguments";
      fill_pattern({buffer.data(), target.length}, seed);
      Connection& via = connections[k];
      try {
        via.wait(via.write(region, 0, target, 0, target.length, Signal::always), std::chrono::seconds(30));
      } catch (const Error& e) {
        return "refused " + std::string(errc_name(e.code())) + ": " + e.what();
      }
      return "ok";
    }
    if (verb == "burst") {
      std::uint64_t n = 0, tag = 0;
      std::uint32_t id = 0;
      in >> n >> id >> tag;
      constexpr std::uint64_t kPiece = 64;
      if (!region.contains(0, n * kPiece)) return "bad burst arguments";
      const RegionDescriptor target = c.wait_region(id, std::chrono::seconds(30));
      OpId last = 0;
      for (std::uint64_t i = 0; i < n; ++i) {
        fill_pattern({buffer.data() + i * kPiece, kPiece}, tag + i);
        last = c.write_and_ring(region, i * kPiece, target, i * kPiece, kPiece, static_cast<std::uint32_t>(tag + i));
      }
      c.wait(last, std::chrono::seconds(60));
      for (std::uint64_t i = 0; i < n; ++i) send_text(c, std::to_string(tag + i));
      return "sent " + std::to_string(n);
    }
    if (verb == "connect_again") {
      connect_once();
      return "ok";
    }
    return "unknown command: " + verb;
  }

  int serve() {
    const auto idle_limit = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    for (;;) {
      // Indexing, not iterators: a command may open another connection while we loop.
      for (std::size_t i = 0; i < connections.size(); ++i) {
        Connection& c = connections[i];
        if (c.failed()) continue;  // a `write` the target refused: the other connections carry on
        std::optional<std::vector<std::byte>> message;
        try {
          message = c.try_receive();
        } catch (const Error&) {
          if (i == 0) throw;  // the control connection: the test is gone
          continue;           // a data connection the test closed or a write failed
        }
        if (!message) continue;
        const std::string line = text_of(*message);
        if (line == "exit") {
          reply(c, "bye");
          for (auto& other : connections) {
            if (!other.failed()) other.flush(std::chrono::seconds(10));
          }
          return 0;
        }
        reply(c, run(c, line));
      }
      if (std::chrono::steady_clock::now() > idle_limit) {
        std::fprintf(stderr, "peer: no exit command within 5 minutes, giving up\n");
        return 3;
      }
    }
  }
};

// Drops CAP_IPC_LOCK (root has it, and it lifts RLIMIT_MEMLOCK) and lowers the limit to
// 64 KiB, then checks both the up-front check and a real registration report the problem.
int memlock_scenario() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
  if (::syscall(SYS_capget, &header, data) != 0) {
    std::perror("peer: capget");
    return 3;
  }
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
  if (::syscall(SYS_capset, &header, data) != 0) {
    std::perror("peer: dropping CAP_IPC_LOCK");
    return 3;
  }
  rlimit limit{64 * 1024, 64 * 1024};
  if (::setrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    std::perror("peer: setrlimit");
    return 3;
  }
  int failures = 0;
  try {
    check_memlock(8u << 20);
    std::fprintf(stderr, "peer: check_memlock(8 MiB) passed under a 64 KiB limit\n");
    ++failures;
  } catch (const Error& e) {
    const std::string what = e.what();
    if (e.code() != Errc::memlock_too_low || what.find("ulimit -l") == std::string::npos ||
        what.find("64 KiB") == std::string::npos) {
      std::fprintf(stderr, "peer: check_memlock message not actionable: %s\n", e.what());
      ++failures;
    }
  }
  try {
    Device device = Device::open(selector_from_env());
    Buffer buffer = Buffer::allocate(8u << 20, Buffer::Pages::small_only);
    MemoryRegion mr = MemoryRegion::register_buffer(device, buffer, Access::remote_write);
    std::fprintf(stderr, "peer: registering 8 MiB succeeded under a 64 KiB limit\n");
    ++failures;
  } catch (const Error& e) {
    const std::string what = e.what();
    if (e.code() != Errc::memlock_too_low || what.find("ibv_reg_mr") == std::string::npos ||
        what.find("ulimit -l") == std::string::npos) {
      std::fprintf(stderr, "peer: registration error not actionable (%s): %s\n",
                   std::string(errc_name(e.code())).c_str(), e.what());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

// A half-open peer: sends a gradlane connect request to ADDRESS:PORT and then never reads its
// event channel, so librdmacm never answers the server's reply and the handshake never
// completes. Prints "requested" once the request is out, then sleeps until killed.
int half_open_scenario(const std::string& address, std::uint16_t port) {
  const Device device = Device::open(selector_from_env());
  rdma_event_channel* channel = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (channel == nullptr || rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP) != 0) {
    std::perror("peer: rdma_create_id");
    return 3;
  }
  sockaddr_in src{}, dst{};
  src.sin_family = dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  if (::inet_pton(AF_INET, device.info().ipv4_address.c_str(), &src.sin_addr) != 1 ||
      ::inet_pton(AF_INET, address.c_str(), &dst.sin_addr) != 1) {
    std::fprintf(stderr, "peer: bad address\n");
    return 2;
  }
  const auto expect = [&](rdma_cm_event_type wanted) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(channel, &event) != 0) return false;
    const bool ok = event->event == wanted;
    rdma_ack_cm_event(event);
    return ok;
  };
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst), 5000) != 0 ||
      !expect(RDMA_CM_EVENT_ADDR_RESOLVED) || rdma_resolve_route(id, 5000) != 0 ||
      !expect(RDMA_CM_EVENT_ROUTE_RESOLVED)) {
    std::perror("peer: resolving the server");
    return 3;
  }
  // gradlane's handshake (transport/wire.hpp), little-endian: magic "GLN1", protocol version 2,
  // key length 0 and the 32-byte key field (no key, as test_options()): one the listener
  // accepts, so it answers with a QP of its own and waits for the handshake to complete.
  unsigned char handshake[40] = {'G', 'L', 'N', '1', 2, 0, 0, 0};
  rdma_conn_param param{};
  param.private_data = handshake;
  param.private_data_len = sizeof handshake;
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.retry_count = 1;
  param.qp_num = 1;  // no QP: the handshake is never meant to complete
  if (rdma_connect(id, &param) != 0) {
    std::perror("peer: rdma_connect");
    return 3;
  }
  std::printf("requested\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::minutes(5));
  return 0;
}

}  // namespace

int peer_main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[2]) == "memlock") return memlock_scenario();
  if (argc == 5 && std::string(argv[2]) == "half-open") {
    return half_open_scenario(argv[3], static_cast<std::uint16_t>(std::atoi(argv[4])));
  }
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: %s --peer ADDRESS PORT REGION_BYTES | --peer memlock | --peer half-open ADDRESS PORT\n",
                 argv[0]);
    return 2;
  }
  try {
    Peer peer(Device::open(selector_from_env()), argv[2], static_cast<std::uint16_t>(std::atoi(argv[3])),
              std::strtoull(argv[4], nullptr, 10));
    peer.connect_once();
    return peer.serve();
  } catch (const Error& e) {
    const bool connection_failed = e.code() == Errc::peer_gone || e.code() == Errc::remote_access ||
                                   e.code() == Errc::operation_failed || e.code() == Errc::protocol;
    std::fprintf(stderr, "peer: %s: %s\n", std::string(errc_name(e.code())).c_str(), e.what());
    return connection_failed ? 10 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer: %s\n", e.what());
    return 3;
  }
}

}  // namespace gradlane::testing
