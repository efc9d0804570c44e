// gradlane — a completion queue shared by many connections.
//
// By default each Connection has its own completion queue, and a server that serves N
// workers polls N queues per round. A CompletionQueue is one queue for all of them: the
// Listener (use_completion_queue) and connect() attach connections to it, one poll() reaps
// every connection's completions and hands each to its connection (its doorbells, messages
// and send completions then wait there, to be taken without polling: has_pending_input()).
// It grows as connections join (each may need send + receive queue depth entries).
//
// wait() blocks on the queue's completion channel — and on the attached connections' rdma_cm
// channels, so a peer's disconnect wakes it too — until something arrives or the timeout
// passes: an idle receiver sleeps instead of spinning a core. Its cost is the wake-up latency
// (an interrupt and a thread wake-up); poll in a loop while busy, wait() once idle.
//
// Shared receives (an SRQ): by default every connection keeps recv_queue_depth receives
// posted, each a buffer of max_message_bytes — 128 × 4 KiB = 512 KiB registered per
// connection, 512 MiB for a server with 1,000 workers. With `shared_receives` > 0 the
// attached connections draw from one shared receive queue of that many buffers instead (the
// doorbells and control messages of all workers are bursty, never all at once). A connection
// whose max_message_bytes exceeds the queue's is refused (Error(invalid_argument)). When the
// shared queue runs dry, senders are told "receiver not ready" and retry (rnr_retry), as with
// a full per-connection queue.
//
// A cheap handle: copies share one queue, and every attached connection keeps it alive. Used
// by one thread at a time, like the connections on it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "gradlane/device.hpp"

namespace gradlane {

namespace detail {
class SharedCq;
struct CqAccess;  // lets the transport reach state_
}  // namespace detail

class CompletionQueue {
 public:
  // Creates the queue (initially `entries` deep) and its completion channel on `device`;
  // with shared_receives > 0, also a shared receive queue of that many buffers of
  // max_message_bytes (+ the frame header) for every connection attached.
  explicit CompletionQueue(const Device& device, std::uint32_t entries = 1024, std::uint32_t shared_receives = 0,
                           std::uint32_t max_message_bytes = 4096);

  // Reaps what completed on every attached connection; returns how many completions.
  // Connections whose peer failed are marked failed (their next call throws).
  int poll();
  // Blocks until a completion or a connection event arrives, or `timeout` passes; true when
  // something arrived (call poll() and take it), false on timeout. Never spins.
  bool wait(std::chrono::milliseconds timeout);
  // Connections attached now.
  std::size_t connections() const;
  // Buffers in the shared receive queue (0: receives are per connection), and the bytes of
  // receive buffers registered for all attached connections together.
  std::uint32_t shared_receives() const;
  std::uint64_t receive_buffer_bytes() const;

 private:
  friend class Listener;
  friend struct detail::CqAccess;
  std::shared_ptr<detail::SharedCq> state_;
};

}  // namespace gradlane
