#include "common/session.hpp"

#include <algorithm>
#include <iostream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

namespace gradlane::perf {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kProtocolVersion = 1;
// A passive wait naps between polls, 50 µs at first and doubling to 20 ms: quick for a
// barrier, and nearly silent while the other side measures. (Each wake-up costs the VM
// timer interrupts and HPET reads that would otherwise slow rxe on the other vCPU.)
constexpr auto kFirstNap = 50us;
constexpr auto kLongestNap = std::chrono::microseconds(20ms);

std::string text_of(const std::vector<std::byte>& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::string first_word(const std::string& line) { return line.substr(0, line.find(' ')); }
std::string rest_of(const std::string& line) {
  const auto space = line.find(' ');
  return space == std::string::npos ? std::string() : line.substr(space + 1);
}

// Connects, retrying while nothing listens yet: a client started next to its server must not
// depend on who wins the race (perftest's clients fail at once; scripts then sleep).
Connection connect_with_retry(const Device& device, const PerfOptions& o, const TransportOptions& transport,
                              std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (int attempt = 1;; ++attempt) {
    try {
      return connect(device, o.server_address, o.port, transport);
    } catch (const Error& e) {
      const bool not_up_yet = e.code() == Errc::connection_rejected || e.code() == Errc::unreachable;
      if (!not_up_yet || Clock::now() + 200ms > deadline) {
        throw Error(e.code(), fmt::format("no {} server answered at {}:{} within {} s ({} attempts): {}", o.kind.name,
                                          o.server_address, o.port, timeout.count() / 1000, attempt, e.what()));
      }
      std::this_thread::sleep_for(200ms);
    }
  }
}

}  // namespace

std::string RunPlan::to_hello() const {
  std::string sizes_text;
  for (auto s : sizes) sizes_text += (sizes_text.empty() ? "" : ",") + std::to_string(s);
  return fmt::format("hello {} {} qps={} iters={} duration={} tx={} cqmod={} sizes={}", kProtocolVersion, test, qps,
                     iterations, duration, tx_depth, cq_mod, sizes_text);
}

RunPlan RunPlan::from_hello(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  int version = 0;
  RunPlan plan;
  in >> word >> version >> plan.test;
  if (word != "hello" || version != kProtocolVersion || plan.test.empty()) {
    throw Error(Errc::protocol,
                fmt::format("expected 'hello {} <test> ...' from the client, got '{}'", kProtocolVersion, line));
  }
  while (in >> word) {
    const auto eq = word.find('=');
    if (eq == std::string::npos) throw Error(Errc::protocol, "malformed hello field '" + word + "'");
    const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
    try {
      if (key == "qps")
        plan.qps = std::stoi(value);
      else if (key == "iters")
        plan.iterations = std::stoull(value);
      else if (key == "duration")
        plan.duration = std::stoi(value);
      else if (key == "tx")
        plan.tx_depth = std::stoi(value);
      else if (key == "cqmod")
        plan.cq_mod = std::stoi(value);
      else if (key == "sizes") {
        std::istringstream list(value);
        for (std::string item; std::getline(list, item, ',');) plan.sizes.push_back(std::stoull(item));
      }
    } catch (const std::exception&) {
      throw Error(Errc::protocol, "malformed hello field '" + word + "'");
    }
  }
  if (plan.sizes.empty() || plan.qps < 1 || plan.qps > 16 || plan.tx_depth < 1 ||
      std::any_of(plan.sizes.begin(), plan.sizes.end(), [](auto s) { return s == 0 || s > kMaxSize; })) {
    throw Error(Errc::protocol, "hello carries an impossible plan: '" + line + "'");
  }
  return plan;
}

std::size_t RunPlan::max_size() const { return *std::max_element(sizes.begin(), sizes.end()); }

Session Session::establish(const PerfOptions& o) {
  const auto timeout = std::chrono::milliseconds(std::int64_t{o.timeout} * 1000);
  const TransportOptions transport = o.transport();
  Session s(Device::open(o.device), o.is_server(), timeout);
  if (s.server_) {
    s.listener_.emplace(s.device_, o.port, transport);
    std::cout << "\n************************************\n"
              << "* Waiting for client to connect... *\n"
              << "************************************\n"
              << std::flush;
    s.connections_.push_back(s.listener_->accept(timeout));
    const std::string hello = s.receive_line();
    try {
      s.plan_ = RunPlan::from_hello(hello);
      if (s.plan_.test != o.kind.test) {
        throw Error(Errc::protocol, fmt::format("the client runs {} but this server is {}: start the same tool on "
                                                "both sides",
                                                s.plan_.test, o.kind.name));
      }
    } catch (const Error& e) {
      s.send_line(std::string("error ") + e.what());
      throw;
    }
    for (int q = 1; q < s.plan_.qps; ++q) s.connections_.push_back(s.listener_->accept(timeout));
  } else {
    s.plan_.test = o.kind.test;
    s.plan_.qps = o.qps;
    s.plan_.iterations = o.iterations;
    s.plan_.duration = o.duration;
    s.plan_.tx_depth = o.tx_depth;
    s.plan_.cq_mod = o.cq_mod.value_or(0);
    s.plan_.sizes = o.sizes();
    s.connections_.push_back(connect_with_retry(s.device_, o, transport, timeout));
    s.send_line(s.plan_.to_hello());
    for (int q = 1; q < s.plan_.qps; ++q)
      s.connections_.push_back(connect_with_retry(s.device_, o, transport, timeout));
  }
  return s;
}

Session::~Session() = default;

const MemoryRegion& Session::register_buffer(std::size_t bytes, Access access) {
  // Fails early with the library's actionable message instead of a bare ENOMEM from ibv_reg_mr.
  check_memlock(bytes);
  Buffer& buffer = buffers_.emplace_back(Buffer::allocate(bytes));
  std::fill(buffer.data(), buffer.data() + buffer.size(), std::byte{0});
  return regions_.emplace_back(MemoryRegion::register_buffer(device_, buffer, access));
}

void Session::publish(const MemoryRegion& region) {
  for (auto& c : connections_) c.advertise(1, region.descriptor());
}

RegionDescriptor Session::peer_region(std::size_t qp) { return connections_.at(qp).wait_region(1, timeout_); }

void Session::send_line(const std::string& line) { control().send(std::as_bytes(std::span(line))); }

std::string Session::receive_line(bool spin) {
  if (spin) return text_of(control().receive(timeout_));
  const auto deadline = Clock::now() + timeout_;
  for (auto nap = std::chrono::microseconds(kFirstNap);; nap = std::min(nap * 2, kLongestNap)) {
    if (auto message = control().try_receive()) return text_of(*message);
    if (Clock::now() > deadline) {
      throw Error(Errc::timeout, fmt::format("the peer on {} sent nothing for {} s (--timeout)", control().describe(),
                                             timeout_.count() / 1000));
    }
    std::this_thread::sleep_for(nap);
  }
}

std::string Session::expect(const std::string& word, bool spin) {
  const std::string line = receive_line(spin);
  if (first_word(line) == "error") throw Error(Errc::protocol, "the peer gave up: " + rest_of(line));
  if (first_word(line) != word) {
    throw Error(Errc::protocol, fmt::format("expected '{}' from the peer, got '{}'", word, line));
  }
  return rest_of(line);
}

void Session::barrier(std::size_t bytes) {
  send_line(fmt::format("sync {}", bytes));
  const std::string got = expect("sync");
  if (got != std::to_string(bytes)) {
    throw Error(Errc::protocol, fmt::format("out of step: at size {} the peer is at size {}", bytes, got));
  }
}

void Session::finish() {
  if (finished_) return;
  finished_ = true;
  if (server_) {
    expect("bye");
    send_line("bye");
    control().flush(timeout_);
  } else {
    send_line("bye");
    expect("bye");
  }
}

}  // namespace gradlane::perf
