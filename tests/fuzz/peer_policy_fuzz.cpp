// Fuzz target: the peer protocol's state machine (sidecar/peer/distributed_policy.cpp) driven by
// a hostile peer sidecar. Host A serves the receiver (endpoint 0), host B two workers
// (endpoints 1 and 2) whose requests A schedules; the two talk over an in-memory link. The input
// is a sequence of actions (a u8 each, then its operands):
//   0  an app on B submits a request (id 1..8, a sender, a size): B forwards it to A
//   1  a message from the input reaches B as from A (the peer answering B's requests)
//   2  a message from the input reaches A as from B (the peer asking A for slots)
//   3  both sides schedule, and the honest messages between them cross
//   4  B reports the oldest transfer A granted it as done (or failed)
//   5  the clock moves on
//   6  the link fails
//
// What must hold (a violation aborts, so libFuzzer keeps the input):
//   - a message that is malformed or does not fit the policy's state is refused inside the
//     policy (Error(protocol), counted): nothing escapes schedule(), nothing crashes, no
//     sanitizer report;
//   - every outcome B's daemon is handed for a request of its own names a part of that request:
//     part < part_count, the same part_count for every outcome of the request, bytes within the
//     request, and never two outcomes for one part.
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <span>
#include <variant>
#include <vector>

#include "common/overloaded.hpp"
#include "fuzz_util.hpp"
#include "sidecar/peer/distributed_policy.hpp"

namespace gradlane::fuzz {
namespace {

using sched::Instant;
using sched::Nanos;

struct Wire {
  std::deque<std::vector<std::byte>> to[2];  // to[0]: A's inbox, to[1]: B's
  bool broken = false;
};

class MemoryTransport final : public peer::PeerTransport {
 public:
  MemoryTransport(Wire& wire, int side) : wire_(wire), side_(side) {}
  std::size_t peer_count() const override { return 1; }
  bool send(peer::PeerIndex, std::span<const std::byte> m) override {
    if (wire_.broken) return false;
    // A peer that never reads must not grow the fuzzer's memory without bound.
    if (wire_.to[1 - side_].size() < 4096) wire_.to[1 - side_].emplace_back(m.begin(), m.end());
    return true;
  }
  std::optional<std::pair<peer::PeerIndex, std::vector<std::byte>>> receive() override {
    auto& q = wire_.to[side_];
    if (q.empty()) return std::nullopt;
    auto m = std::move(q.front());
    q.pop_front();
    return std::pair{peer::PeerIndex{0}, std::move(m)};
  }
  std::vector<peer::PeerIndex> take_failed() override {
    if (!wire_.broken || reported_) return {};
    reported_ = true;
    return {0};
  }
  std::string describe(peer::PeerIndex) const override { return side_ == 0 ? "b" : "a"; }

 private:
  Wire& wire_;
  int side_;
  bool reported_ = false;
};

sched::SchedulerConfig config() {
  sched::SchedulerConfig c;
  c.replica_bound.reset();
  c.grant_horizon = Nanos{1'000'000'000};
  return c;
}

// What B's daemon was told about each of its requests.
struct Seen {
  sched::Bytes bytes = 0;
  std::uint32_t part_count = 0;  // 0 until the first outcome
  std::set<std::uint32_t> parts;
};

class Rig {
 public:
  void submit(Input& in) {
    const std::uint64_t id = 1 + in.take<std::uint8_t>() % 8;
    const std::uint32_t sender = 1 + in.take<std::uint8_t>() % 2;
    const sched::Bytes bytes = 1 + in.take<std::uint32_t>() % (std::uint32_t{1} << 24);
    const sched::Request r{sched::RequestId{id},
                           sched::JobId{1},
                           sched::EndpointId{sender},
                           sched::EndpointId{0},
                           sched::TensorId{1},
                           bytes,
                           0,
                           1.0,
                           0};
    if (b_.submit(r, now_) == sched::SubmitStatus::accepted) seen_[id] = Seen{bytes, 0, {}};
  }
  void inject(Input& in, int side) {
    const auto bytes = in.bytes(in.take<std::uint16_t>() % 512);
    wire_.to[side].emplace_back(bytes.begin(), bytes.end());
  }
  void schedule() {
    for (int i = 0; i < 4; ++i) {
      a_out_.clear();
      a_.schedule(now_, a_out_);
      const std::size_t first = b_out_.size();
      b_.schedule(now_, b_out_);
      for (std::size_t k = first; k < b_out_.size(); ++k) check(b_out_[k]);
    }
  }
  void complete(Input& in) {
    for (const sched::Outcome& o : b_out_) {
      if (const auto* g = std::get_if<sched::Grant>(&o); g && !completed_.contains(sched::to_int(g->transfer))) {
        completed_.insert(sched::to_int(g->transfer));
        b_.complete(g->transfer, now_, Nanos{in.take<std::uint16_t>()},
                    in.take<std::uint8_t>() % 2 ? sched::TransferResult::failed : sched::TransferResult::ok);
        return;
      }
    }
  }
  void advance(Input& in) { now_ += Nanos{in.take<std::uint32_t>()}; }
  void break_link() { wire_.broken = true; }

 private:
  void check(const sched::Outcome& outcome) {
    std::visit(detail::Overloaded{[&](const sched::AggregateGrant&) {}, [&](const sched::Cancel&) {},
                                  [&](const auto& part) {
                                    const auto it = seen_.find(static_cast<std::uint64_t>(part.request));
                                    require(it != seen_.end(), "an outcome for a request B never submitted");
                                    Seen& s = it->second;
                                    require(part.part < part.part_count, "an outcome's part is not below its count");
                                    require(s.part_count == 0 || s.part_count == part.part_count,
                                            "outcomes of one request with different part counts");
                                    s.part_count = part.part_count;
                                    require(part.part_count <= s.bytes, "more parts than the request has bytes");
                                    require(part.length <= s.bytes && part.offset <= s.bytes - part.length,
                                            "an outcome's bytes outside its request");
                                    require(s.parts.insert(part.part).second, "two outcomes for one part");
                                  }},
               outcome);
  }

  Wire wire_;
  MemoryTransport a_side_{wire_, 0}, b_side_{wire_, 1};
  peer::DistributedPolicy a_{config(), {0}, a_side_};
  peer::DistributedPolicy b_{config(), {1, 2}, b_side_};
  std::vector<sched::Outcome> a_out_, b_out_;
  std::map<std::uint64_t, Seen> seen_;
  std::set<std::uint64_t> completed_;
  Instant now_{Nanos{1'000'000}};

 public:
  Rig() {
    a_.start();
    b_.start();
    schedule();
    require(a_.ready() && b_.ready(), "the two sidecars did not greet each other");
    b_out_.clear();
  }
};

}  // namespace
}  // namespace gradlane::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradlane::fuzz;
  Input in(as_bytes(data, size));
  Rig rig;
  in.for_each_action(7, [&](unsigned action) {
    switch (action) {
      case 0:
        rig.submit(in);
        break;
      case 1:
        rig.inject(in, 1);
        break;
      case 2:
        rig.inject(in, 0);
        break;
      case 3:
        rig.schedule();
        break;
      case 4:
        rig.complete(in);
        break;
      case 5:
        rig.advance(in);
        break;
      default:
        rig.break_link();
        break;
    }
  });
  rig.schedule();
  return 0;
}
