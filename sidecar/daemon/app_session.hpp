// What the daemon knows about one attached application, in the daemon's own memory.
//
// Nothing here is read back from the shared segment after attach: the ring positions, the
// app's identity and limits, and the requests it is owed answers for are the daemon's private
// copies, so a misbehaving app can corrupt only its own queues, never the daemon's view.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sidecar/core/types.hpp"
#include "sidecar/daemon/entry_check.hpp"
#include "sidecar/shm/layout.hpp"
#include "sidecar/shm/process.hpp"

namespace gradlane::sidecar {

// Granted parts of one request whose completion has not come back yet. Most requests are a
// single part, so the first is kept inline and the common case allocates nothing.
class OpenTransfers {
 public:
  void add(std::uint32_t part, sched::TransferId transfer) {
    if (!first_) {
      first_.emplace(part, transfer);
    } else {
      rest_.emplace_back(part, transfer);
    }
  }
  // Removes and returns the transfer of `part`, if it is open.
  std::optional<sched::TransferId> take(std::uint32_t part) {
    if (first_ && first_->first == part) {
      const sched::TransferId t = first_->second;
      first_.reset();
      if (!rest_.empty()) {
        first_ = rest_.back();
        rest_.pop_back();
      }
      return t;
    }
    for (auto it = rest_.begin(); it != rest_.end(); ++it) {
      if (it->first == part) {
        const sched::TransferId t = it->second;
        rest_.erase(it);
        return t;
      }
    }
    return std::nullopt;
  }
  bool empty() const noexcept { return !first_; }
  template <class F>
  void for_each(F&& f) const {
    if (first_) f(first_->second);
    for (const auto& [part, transfer] : rest_) f(transfer);
  }

 private:
  std::optional<std::pair<std::uint32_t, sched::TransferId>> first_;
  std::vector<std::pair<std::uint32_t, sched::TransferId>> rest_;
};

// A request the app is still owed something for: outcomes for some parts, or the completion
// of a granted part (which the policy needs back to return credit and learn bandwidth).
struct OwedRequest {
  sched::RequestId id{};         // the daemon-wide id the policy knows it by
  std::uint64_t bytes = 0;       // as requested: counted in AppSession::owed_bytes until settled
  std::uint32_t part_count = 0;  // 0 until the first outcome tells
  std::uint32_t decided = 0;     // parts with an outcome
  OpenTransfers granted;
  sched::Instant submitted{};  // when the daemon took it (its push's latency, for metrics)

  bool settled() const noexcept { return part_count != 0 && decided == part_count && granted.empty(); }
};

struct AppSession {
  std::uint32_t slot = 0;
  std::uint32_t pid = 0;
  std::optional<ProcessWatch> owner;
  AppLimits limits;
  shm::RingReader<shm::AppEntry, shm::kRingCapacity> requests;
  shm::RingWriter<shm::GrantEntry, shm::kRingCapacity> grants;
  // Grants that did not fit in the ring. Never dropped: while any wait here the daemon stops
  // taking this app's requests, so the backpressure reaches the app as a full request queue.
  std::deque<shm::GrantEntry> outbox;
  std::unordered_map<std::uint64_t, OwedRequest> owed;  // by the app's request id
  std::uint64_t owed_bytes = 0;                         // the sum of owed's bytes
  // Refused past its bounds (max_outstanding, max_owed_bytes): until something it owes is
  // settled, one of its entries is taken at a time instead of batch_per_app, no sooner than
  // `read_again_at` (DaemonConfig::over_bound_every after the last), so an app that keeps
  // asking past its bound costs the other jobs neither a batch per pass nor a busy loop.
  bool over_bound = false;
  sched::Instant read_again_at{};
  // Over its bound and not to be read before `read_again_at`: its entries wait.
  bool deferred(sched::Instant now) const noexcept { return over_bound && now < read_again_at; }
  std::unordered_map<std::uint64_t, sched::TransferId> aggregates;  // forwarded by this app
  bool notify = false;  // grants were published this pass: wake the app if it sleeps
};

}  // namespace gradlane::sidecar
