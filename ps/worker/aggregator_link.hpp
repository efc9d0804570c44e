// A worker's link to the aggregator it pushes through (WorkerOptions::aggregator): the
// connection and the aggregator's member ring, the pushes it took and has not yet said what
// became of (PushResult::pending), the outcomes it said, and a restarted aggregator found
// again through the server's notice. Lost, the link reports every member it held not
// delivered, and the worker pushes to the server (direct mode) or reports redirects to it
// lost (sidecar mode) until one is found again.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "gradlane/connection.hpp"
#include "gradlane/device.hpp"
#include "gradlane/ps/worker.hpp"
#include "ps/protocol/messages.hpp"

namespace gradlane::ps {

class AggregatorLink {
 public:
  // `bytes`: one update's (a member slot's size); `sidecar_mode`: only how a loss is told.
  AggregatorLink(const Device& device, const WorkerOptions& options, std::size_t bytes, bool sidecar_mode);
  AggregatorLink(const AggregatorLink&) = delete;
  AggregatorLink& operator=(const AggregatorLink&) = delete;

  // Connects to the configured aggregator (the worker's start), bounded by `timeout`.
  void connect(Millis timeout);
  bool up() const { return conn_.has_value(); }
  Connection& connection() { return *conn_; }
  const RegionDescriptor& ring() const { return ring_; }
  // The member slot an id (a member sequence, or a sidecar's aggregate id) writes to.
  std::uint64_t slot_of(std::uint64_t id) const { return id % (ring_.length / bytes_); }

  // The aggregator took push `tag` as `member`: pending until it says what became of it.
  void took(std::uint64_t member, std::uint64_t tag) { pending_.push_back({member, tag}); }
  void take_forwarded(const Forwarded& f);
  // Reads what the aggregator said, without waiting; never while a direct-mode push waits for
  // its grant there (the worker reads those). A malformed message costs the aggregator its
  // connection, as a dead one does.
  void take_messages();
  // The connection failed, or said something wrong: its held members are not delivered.
  void drop(const std::string& why);
  // The server passed on where an aggregator listens: ours, restarted, is found again.
  void heard_of(const ListeningAt& at);
  // Before a push: one found again becomes the link from now on (the push in flight asked the
  // server); one announced while the old connection still looked alive is tried again.
  void before_push();

  std::vector<MemberOutcome> take_outcomes();
  std::size_t pending() const { return pending_.size(); }
  // The worker pushes no more: says Bye, then waits up to `timeout` for every pending
  // member's outcome. False if some are still pending then.
  bool settle(Millis timeout);
  // The connections to tell Bye when the worker goes: ours (unless settle() told it) and one
  // found again but never pushed through.
  std::vector<Connection*> to_tell_bye();

 private:
  struct Pending {
    std::uint64_t member = 0;
    std::uint64_t tag = 0;
  };
  Connection connect_to(const std::string& address, std::uint16_t port, Millis timeout);

  Device device_;
  std::uint32_t worker_;
  std::optional<Endpoint> configured_;
  TransportOptions transport_;
  std::size_t bytes_;
  bool sidecar_mode_;
  std::optional<Connection> conn_;
  RegionDescriptor ring_;
  std::deque<Pending> pending_;
  std::vector<MemberOutcome> outcomes_;
  bool said_bye_ = false;
  std::optional<Connection> found_again_;
  std::optional<ListeningAt> announced_;  // see heard_of
};

}  // namespace gradlane::ps
