// SlotAgreement: two DistributedPolicies joined by an in-memory transport (the RDMA transport is
// exercised in softroce/), and the requests the tests submit.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <variant>

#include <gtest/gtest.h>

#include <utility>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "gradlane/sidecar.hpp"
#include "sidecar/peer/distributed_policy.hpp"
#include "sidecar/peer/messages.hpp"
#include "sidecar/peer/schedule_log.hpp"

namespace gradlane::peer::test_support {

using sched::Instant;
using sched::Nanos;

// Two ends of an in-memory link; each end sees the other as peer 0.
struct Wire {
  std::deque<std::vector<std::byte>> to[2];
  bool broken = false;
};

class MemoryTransport final : public PeerTransport {
 public:
  MemoryTransport(Wire& wire, int side) : wire_(wire), side_(side) {}
  std::size_t peer_count() const override { return 1; }
  bool send(PeerIndex, std::span<const std::byte> m) override {
    if (wire_.broken) return false;
    wire_.to[1 - side_].emplace_back(m.begin(), m.end());
    return true;
  }
  std::optional<std::pair<PeerIndex, std::vector<std::byte>>> receive() override {
    auto& q = wire_.to[side_];
    if (q.empty()) return std::nullopt;
    auto m = std::move(q.front());
    q.pop_front();
    return std::pair{PeerIndex{0}, std::move(m)};
  }
  std::vector<PeerIndex> take_failed() override {
    if (wire_.broken && !reported_) {
      reported_ = true;
      return {0};
    }
    return {};
  }
  std::string describe(PeerIndex) const override { return side_ == 0 ? "host-b" : "host-a"; }

 private:
  Wire& wire_;
  int side_;
  bool reported_ = false;
};

// Host A's end of several in-memory links (A is side 0 of each wire). Links added after
// start-up are reported once by take_joined(), as a restarted peer's new link is.
class HubTransport final : public PeerTransport {
 public:
  PeerIndex add(Wire& wire, bool joined) {
    wires_.push_back(&wire);
    reported_.push_back(false);
    const auto index = static_cast<PeerIndex>(wires_.size() - 1);
    if (joined) joined_.push_back(index);
    return index;
  }
  std::size_t peer_count() const override { return wires_.size(); }
  bool send(PeerIndex p, std::span<const std::byte> m) override {
    if (wires_[p]->broken) return false;
    wires_[p]->to[1].emplace_back(m.begin(), m.end());
    return true;
  }
  std::optional<std::pair<PeerIndex, std::vector<std::byte>>> receive() override {
    for (PeerIndex p = 0; p < wires_.size(); ++p) {
      auto& q = wires_[p]->to[0];
      if (wires_[p]->broken || q.empty()) continue;
      auto m = std::move(q.front());
      q.pop_front();
      return std::pair{p, std::move(m)};
    }
    return std::nullopt;
  }
  std::vector<PeerIndex> take_failed() override {
    std::vector<PeerIndex> failed;
    for (PeerIndex p = 0; p < wires_.size(); ++p) {
      if (wires_[p]->broken && !reported_[p]) {
        reported_[p] = true;
        failed.push_back(p);
      }
    }
    return failed;
  }
  std::vector<PeerIndex> take_joined() override { return std::exchange(joined_, {}); }
  std::string describe(PeerIndex p) const override { return "link-" + std::to_string(p); }

 private:
  std::vector<Wire*> wires_;
  std::vector<bool> reported_;
  std::vector<PeerIndex> joined_;
};

inline sched::SchedulerConfig config() {
  sched::SchedulerConfig c;
  c.replica_bound.reset();
  c.grant_horizon = Nanos{1'000'000'000};
  return c;
}

inline sched::Request request(std::uint64_t id, std::uint32_t sender, std::uint64_t bytes) {
  return sched::Request{sched::RequestId{id},
                        sched::JobId{1},
                        sched::EndpointId{sender},
                        sched::EndpointId{0},
                        sched::TensorId{static_cast<std::uint32_t>(id)},
                        bytes,
                        0,
                        1.0,
                        0};
}

class SlotAgreement : public ::testing::Test {
 protected:
  Wire wire;
  MemoryTransport a_side{wire, 0}, b_side{wire, 1};
  // Host A hosts the server (endpoint 0); host B hosts two workers (endpoints 1 and 2).
  DistributedPolicy a{config(), {0}, a_side};
  DistributedPolicy b{config(), {1, 2}, b_side};
  std::vector<sched::Outcome> a_out, b_out;
  Instant now{Nanos{1'000'000}};

  void SetUp() override {
    a.start();
    b.start();
    exchange();
    ASSERT_TRUE(a.ready() && b.ready());
  }
  // Lets messages cross until both sides are quiet.
  void exchange() {
    for (int i = 0; i < 8; ++i) {
      b.schedule(now, b_out);
      a.schedule(now, a_out);
    }
  }
};

}  // namespace gradlane::peer::test_support
