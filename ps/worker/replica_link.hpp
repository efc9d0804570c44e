// A worker's link to its shard's replica: the one it was given (WorkerOptions::replica), or one
// the server announced as it joined the running shard. Each push is mirrored there first; when
// the server fails, the replica, promoted, is the server from then on (take_as_server). A
// joining replica that was slow to answer is tried again at later pushes before it is given up.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "gradlane/connection.hpp"
#include "gradlane/device.hpp"
#include "gradlane/ps/worker.hpp"
#include "ps/protocol/messages.hpp"

namespace gradlane::ps {

class ReplicaLink {
 public:
  using Clock = std::chrono::steady_clock;
  // Learns a shard's regions (its slot ring and its shard) on a new connection and says who we
  // are (Worker::State::join); throws if the shard is not the one the worker pushes.
  using Join = std::function<std::pair<RegionDescriptor, RegionDescriptor>(Connection&)>;
  // How long a worker tries to reach a replica the server announced, and how often and how far
  // apart.
  static constexpr Millis kReachAnnouncedWithin{5000};
  static constexpr std::uint32_t kReachAttempts = 3;
  static constexpr Millis kReachAgainAfter{5000};

  ReplicaLink(const Device& device, const WorkerOptions& options, Join join);
  ReplicaLink(const ReplicaLink&) = delete;
  ReplicaLink& operator=(const ReplicaLink&) = delete;

  bool up() const noexcept { return conn_.has_value(); }
  Connection& connection() { return *conn_; }
  const RegionDescriptor& slots() const noexcept { return slots_; }
  const RegionDescriptor& shard() const noexcept { return shard_; }

  // Connects to the replica at `address`:`port` within `timeout`; its slot ring must be as
  // large as the server's (`ring_bytes`).
  void connect(const std::string& address, std::uint16_t port, Millis timeout, std::uint64_t ring_bytes);
  // The server said where a replica that joined listens. The server adopts one only when it has
  // none, so one announced elsewhere than ours means ours is not the server's any more.
  void heard_of(const ListeningAt& at, std::uint64_t ring_bytes);
  // Tries to reach an announced replica, if one is due (at most kReachAttempts tries,
  // kReachAgainAfter apart); a failure leaves the link down.
  void reach_announced(std::uint64_t ring_bytes);
  // A replica that joined is told from which sequence we mirror there (Mirroring), ahead of our
  // first mirror to it on the same QP: true once, for that mirror.
  bool announce_now() noexcept { return std::exchange(announce_, false); }

  // Failover: the replica, promoted, is the server from now on. The link is down afterwards.
  struct AsServer {
    Connection conn;
    RegionDescriptor slots, shard;
  };
  AsServer take_as_server();
  void drop() noexcept { conn_.reset(); }

 private:
  Device device_;
  std::uint32_t worker_;
  bool mirror_;
  TransportOptions transport_;
  Join join_;
  std::optional<Connection> conn_;
  RegionDescriptor slots_, shard_;
  std::pair<std::string, std::uint16_t> address_;  // where conn_ is connected
  bool announce_ = false;
  std::optional<ListeningAt> announced_;
  std::uint32_t attempts_ = 0;
  Clock::time_point next_attempt_{};
};

}  // namespace gradlane::ps
