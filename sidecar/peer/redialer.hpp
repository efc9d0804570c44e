// Redialer: connects again, in the background, to peer sidecars whose links this sidecar made
// and lost — the peer restarted (its new gradlaned listens on the same address) or its host
// came back.
//
// Why a thread: connect() waits for rdma_cm (address and route resolution, the peer's answer)
// up to its timeout, and a daemon must never block its loop on one peer. Each lost address
// gets one thread that tries every `retry_every` until a connection is made or the Redialer is
// destroyed; the loop collects finished connections with take(), without waiting. A thread
// touches only its own connect() and the inbox under the mutex; verbs objects made on one
// thread and used on another are safe (libibverbs is thread-safe per context).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gradlane/connection.hpp"

namespace gradlane::peer {

struct PeerAddress {
  std::string address;
  std::uint16_t port = 0;
};

class Redialer {
 public:
  // `options.connect_timeout` bounds each attempt; the device must outlive the Redialer.
  Redialer(const Device& device, const TransportOptions& options, std::chrono::milliseconds retry_every);
  Redialer(const Redialer&) = delete;
  Redialer& operator=(const Redialer&) = delete;
  ~Redialer();  // stops every attempt (waits at most one connect timeout)

  // Starts reconnecting to `peer` (no effect if already under way).
  void redial(const PeerAddress& peer);
  // The connections made since the last call, with the address each was made to.
  std::vector<std::pair<PeerAddress, Connection>> take();

 private:
  // `key`: the attempt's "address:port", as redial() filed it.
  void run(std::stop_token stop, PeerAddress peer, std::string key);

  struct Attempt {
    std::string key;    // "address:port"
    bool done = false;  // set by its thread, under the mutex, as its last act
    std::jthread thread;
  };
  // Joins the threads that finished (outside the lock: a jthread's destructor joins).
  void reap();

  const Device& device_;
  TransportOptions options_;
  std::chrono::milliseconds retry_every_;
  std::mutex mutex_;
  std::condition_variable_any wake_;  // interrupts the wait between attempts on destruction
  std::vector<std::pair<PeerAddress, Connection>> made_;
  std::vector<Attempt> attempts_;  // last: stopped and joined before the rest goes
};

}  // namespace gradlane::peer
