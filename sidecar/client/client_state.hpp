// Internal: what a Client holds while attached, and the attach protocol (attach.cpp) that
// fills it in. Shared by client.cpp and the test hooks in internals.hpp.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "gradlane/sidecar.hpp"
#include "sidecar/shm/layout.hpp"
#include "sidecar/shm/segment.hpp"

namespace gradlane::sidecar {

// A daemon whose heartbeat is older than this is taken for dead even if it still holds the
// segment's lock (stopped with SIGSTOP, or wedged). 100x its heartbeat interval, so a loaded
// host never trips it.
inline constexpr std::chrono::milliseconds kStaleHeartbeat{1000};
// While waiting, how often the client asks whether the daemon is still there (a flock probe
// and a clock read), so a daemon crash is noticed within this, not at the caller's timeout.
inline constexpr std::chrono::milliseconds kLivenessEvery{50};

// The requests a client is still owed answers for. Its ids are handed out in sequence, so a
// sliding window [base, base + size) over a deque does what a hash map would, without an
// allocation per request; the window slides as the oldest requests are answered.
class OwedWindow {
 public:
  struct Owed {
    std::uint32_t part_count = 0;  // 0 until the first part's answer tells
    std::uint32_t decided = 0;
    bool open = false;
  };

  // Starts an empty window whose next id is `next`.
  void reset(std::uint64_t next) {
    window_.clear();
    base_ = next;
    open_ = 0;
  }
  // Precondition: id is the next in sequence.
  void add(std::uint64_t id) {
    if (window_.empty()) base_ = id;
    window_.push_back(Owed{0, 0, true});
    ++open_;
  }
  Owed* find(std::uint64_t id) {
    if (id < base_ || id - base_ >= window_.size()) return nullptr;
    Owed& o = window_[id - base_];
    return o.open ? &o : nullptr;
  }
  void close(std::uint64_t id) {
    Owed* o = find(id);
    if (o == nullptr) return;
    o->open = false;
    --open_;
    while (!window_.empty() && !window_.front().open) {
      window_.pop_front();
      ++base_;
    }
  }
  std::size_t size() const noexcept { return open_; }
  template <class F>
  void for_each_open(F&& f) const {
    for (std::size_t i = 0; i < window_.size(); ++i) {
      if (window_[i].open) f(base_ + i);
    }
  }

 private:
  std::uint64_t base_ = 1;
  std::deque<Owed> window_;
  std::size_t open_ = 0;
};

struct Client::State {
  AttachOptions options;
  pid_t pid = 0;
  std::uint64_t start_time = 0;  // ours, written into the slot so the daemon can tell us apart

  // The attachment; empty after a failed reattach (the next call tries again).
  std::optional<shm::Segment> segment;
  shm::Header* header = nullptr;
  shm::AppSlot* slot = nullptr;
  std::uint32_t slot_index = 0;
  std::uint64_t generation = 0;
  shm::RingWriter<shm::AppEntry, shm::kRingCapacity> requests;
  shm::RingReader<shm::GrantEntry, shm::kRingCapacity> grants;

  std::uint64_t next_request = 1;
  OwedWindow owed;              // requests still owed an answer
  std::deque<Grant> made_here;  // sidecar_restarted answers, delivered before the queue
  std::uint32_t empty_polls = 0;
  // poll(): when the daemon's liveness is next due (read every kPollsPerClockRead empty polls).
  std::chrono::steady_clock::time_point next_liveness_poll{};
  std::uint64_t reattachments = 0;

  bool attached() const noexcept { return header != nullptr; }
};

// attach.cpp
// Attaches `state` to the daemon serving options.shm_name within options.attach_timeout, or
// throws (see Client::attach).
void connect(Client::State& state);
// Whether the attached daemon is gone: stopped, lock released (it died), or heartbeat stale.
bool daemon_gone(const Client::State& state);
// Drops the attachment without telling the daemon (it is gone) and answers everything the old
// daemon owed with sidecar_restarted; then tries connect(). Throws what connect() throws.
void reattach(Client::State& state);
// Tells the daemon we leave and unmaps. Never throws.
void leave(Client::State& state) noexcept;

}  // namespace gradlane::sidecar
