// CandidateTable: what waits for a grant in a Scheduler (scheduler.hpp) — each busy sender
// NIC's head part and each pending aggregate — kept in a dense table and indexed at its
// receiver in decision order, so a decision reads a few candidates per receiver instead of
// all of them (the scheduler's "Cost").
//
// The decision order at a receiver: under IngressSharing::packed first the rate class (the
// binary exponent of the path rate in bytes/s: a class's candidates all need at least the
// share 2^class / the receiver's rate, so one look at the receiver's shares bounds when any of
// them can start); then, under Ordering::mlfabric, duration and the larger gradient norm; then
// the id and part (Ordering::fifo: only those). Parts are also indexed by their staleness
// deadline, to find the hopeless ones.
//
// Positions are stable until remove(), which moves the last candidate into the hole: its
// owner (the sender's head, or the pending aggregate) must then be pointed at the new place.
// Not thread-safe; one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "sidecar/core/config.hpp"
#include "sidecar/core/staleness.hpp"
#include "sidecar/core/types.hpp"

namespace gradlane::sched {

// A candidate for the next grant; hot fields first (a decision reads them for every
// candidate it looks at).
struct Candidate {
  Instant not_before{};  // aggregates: when the sum is ready
  Nanos duration{};
  Version deadline = kNoDeadline;
  Bytes length = 0;
  std::uint32_t sender = 0;  // dense NIC index; for an aggregate: the aggregator
  std::uint32_t receiver = 0;
  bool aggregate = false;
  bool direct_only = false;  // Request::direct_only: never a member of an aggregate
  std::uint32_t part = 0;
  std::uint64_t id = 0;  // RequestId or AggregateId
  double norm = 0.0;
  JobId job{};
  TensorId tensor{};
  Bytes offset = 0;
};

// A candidate's place in its receiver's index; unique per candidate.
struct OrderKey {
  int rate_class = 0;
  Nanos duration{};
  double neg_norm = 0.0;
  std::uint64_t id = 0;
  std::uint32_t part = 0;
  bool operator<(const OrderKey& o) const noexcept {
    return std::tie(rate_class, duration, neg_norm, id, part) <
           std::tie(o.rate_class, o.duration, o.neg_norm, o.id, o.part);
  }
  // The first key of the next rate class: where a class's run in an index ends.
  static OrderKey after_class(int rate_class) noexcept { return OrderKey{rate_class + 1, Nanos::min(), 0.0, 0, 0}; }
};

// The candidates bound for one receiver. Values of parts and aggregates are positions in the
// table; deadlines map (deadline, request) to the part's sender.
struct ReceiverQueue {
  std::map<OrderKey, std::uint32_t> parts;
  std::map<OrderKey, std::uint32_t> aggregates;
  std::map<std::pair<Version, std::uint64_t>, std::uint32_t> deadlines;
  bool empty() const noexcept { return parts.empty() && aggregates.empty(); }
};

class CandidateTable {
 public:
  static constexpr int kRateClasses = 64;  // binary exponents of a rate in bytes/s

  CandidateTable(Ordering ordering, bool packed) : ordering_(ordering), packed_(packed) {}

  std::uint32_t add(const Candidate& c);
  // Removes the candidate at `at`. Returns the one that moved into `at` (the last), for its
  // owner to re-point, or nullptr if `at` was the last.
  const Candidate* remove(std::uint32_t at);
  // Puts `c` in place of the candidate at `at`, indexed anew.
  void replace(std::uint32_t at, const Candidate& c);
  void set_duration(std::uint32_t at, Nanos duration);
  void set_deadline(std::uint32_t at, Version deadline);

  const Candidate& operator[](std::uint32_t at) const { return table_[at]; }
  std::size_t size() const noexcept { return table_.size(); }
  const std::vector<Candidate>& all() const noexcept { return table_; }

  // The receivers with a candidate waiting, and each one's queue (only for those).
  const std::set<std::uint32_t>& receivers() const noexcept { return receivers_; }
  const ReceiverQueue& waiting(std::uint32_t receiver) const { return queues_.at(receiver); }

  // The rate class of a candidate: 0 unless packed.
  int rate_class(const Candidate& c) const;

 private:
  OrderKey key(const Candidate& c) const;
  void index(std::uint32_t at);    // after table_[at] is written
  void unindex(std::uint32_t at);  // before table_[at] changes or goes

  Ordering ordering_;
  bool packed_;
  std::vector<Candidate> table_;
  std::vector<ReceiverQueue> queues_;  // by receiver; grown as receivers appear
  std::set<std::uint32_t> receivers_;  // those with a non-empty queue
};

}  // namespace gradlane::sched
