// gradlane — reliable connections and the data path.
//
// A Connection is one RC queue pair to one peer, set up through librdmacm (resolve address →
// resolve route → connect) from the device's own source address. It carries:
//   - one-sided RDMA WRITE, WRITE_WITH_IMM and READ between registered regions, zero-copy;
//   - SEND/RECV control messages (copied through small registered rings — control traffic,
//     not gradients), including the one-time exchange of region descriptors.
//
// The push of an update is the protocol the design card describes: an unsignalled WRITE of
// the payload, then a WRITE_WITH_IMM doorbell whose immediate names the slot. RC delivers in
// order, so when the receiver sees the doorbell's completion the payload is in place.
//
// Completions are reaped by poll() (the progress engine); every wait_* drives poll() itself
// and is bounded by a timeout. A Connection is used by one thread at a time.
//
// Failure: a peer that disconnects or dies, an access the peer's NIC refuses, a malformed
// control message — each moves the connection to the failed state. The failure handler (if
// set) is called once with the Error, failure() returns it, and every later call rethrows it.
// Nothing aborts the process.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradlane/completion_queue.hpp"
#include "gradlane/device.hpp"
#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"
#include "gradlane/memory_window.hpp"
#include "gradlane/options.hpp"

namespace gradlane {

namespace detail {
class ConnectionState;
class ListenerState;
struct ConnectionAccess;  // lets the transport make Connections from their state
}  // namespace detail

using Millis = std::chrono::milliseconds;

// Whether a send-queue operation asks for its own completion.
enum class Signal {
  automatic,  // unsignalled, except one in every `signal_interval` so the send queue drains
  always,     // signalled: wait(op) can wait for exactly this operation
};

// Identifies a posted operation on its connection (increasing from 1).
using OpId = std::uint64_t;

// A WRITE_WITH_IMM doorbell seen by the receiver.
struct Doorbell {
  std::uint32_t imm = 0;
  std::uint32_t bytes = 0;  // payload length of the write that carried the immediate
};

struct ConnectionStats {
  std::uint64_t posted = 0;
  std::uint64_t completed = 0;
  std::uint64_t signalled = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t doorbells_received = 0;
};

class Connection {
 public:
  Connection(Connection&&) noexcept;
  Connection& operator=(Connection&&) noexcept;
  ~Connection();  // disconnects and releases the QP; never throws

  // ---- one-sided operations (zero-copy between registered regions) ----
  // Each checks both slices against their regions first and throws Error(out_of_range) naming
  // the operation, without posting anything, when a slice does not fit. An operation longer
  // than the port's largest message (DeviceInfo::max_message_bytes, 8 MiB on rxe) is posted as
  // a chain of work requests of at most that size; the OpId returned is the last one's, whose
  // completion on the RC queue pair follows every earlier one's, so waiting for it waits for all.
  OpId write(const MemoryRegion& src, std::size_t src_offset, const RegionDescriptor& dst, std::uint64_t dst_offset,
             std::size_t length, Signal signal = Signal::automatic);
  // `length` may be 0: a doorbell with only the immediate.
  OpId write_with_imm(const MemoryRegion& src, std::size_t src_offset, const RegionDescriptor& dst,
                      std::uint64_t dst_offset, std::size_t length, std::uint32_t imm, Signal signal = Signal::always);
  // The push: the payload's WRITE (signalled automatically) chained with a zero-length
  // WRITE_WITH_IMM doorbell (signalled) in one post, so the NIC is rung once. When the
  // receiver sees the doorbell, the payload is in place. Returns the doorbell's op: waiting for
  // it proves both done.
  OpId write_and_ring(const MemoryRegion& src, std::size_t src_offset, const RegionDescriptor& dst,
                      std::uint64_t dst_offset, std::size_t length, std::uint32_t imm);
  // READs are always signalled: the data is only usable once the completion arrives.
  OpId read(const MemoryRegion& dst, std::size_t dst_offset, const RegionDescriptor& src, std::uint64_t src_offset,
            std::size_t length);

  // ---- memory windows (gradlane/memory_window.hpp) ----
  // Binds `window` over region[offset, offset+length) with `access` (remote_write and/or
  // remote_read) on this connection's queue pair, under a fresh key: afterwards only this
  // connection's peer can use window.descriptor(), and only inside that slice. A window that
  // is bound is invalidated in the same post first (type-2 windows bind only when free), so
  // its previous key dies. The bind is signalled; RC executes it before anything posted after
  // it, so the descriptor may be advertised at once. Each bind may take another region (the one
  // bound before stays registered until the window's next bind).
  // Throws, before posting: Error(invalid_argument) when the region was not registered with
  // Access::windows, lacks local_write for a writable window, or belongs to another protection
  // domain; Error(out_of_range) when the slice does not fit; Error(unsupported) for a window
  // over part of a region on a device that does not check window bounds (rdma_rxe).
  OpId bind_window(MemoryWindow& window, const MemoryRegion& region, std::size_t offset, std::size_t length,
                   Access access);
  // Invalidates the window's key (a signalled LOCAL_INV): once wait(op) returns, the peer's
  // accesses with it are refused. The window may be bound again afterwards.
  OpId invalidate_window(MemoryWindow& window);

  // ---- two-sided control messages ----
  // Copies `message` (≤ max_message_bytes bytes; the frame header is not counted) into a
  // registered send slot and posts a SEND. Every SEND is signalled: wait(op, timeout) on the
  // returned op — or flush() — returns once the peer's NIC acknowledged the message, i.e. it
  // left this host and sits in the peer's receive queue (not that the peer read it). A
  // program that sends last words before exiting must wait for them, or they may never
  // leave. When all control slots are busy (the peer stopped acknowledging), send() waits for
  // one up to 10 s, then throws Error(timeout).
  OpId send(std::span<const std::byte> message);
  // send() that never waits: nullopt, with nothing posted, when no control slot or send-queue
  // entry is free right now (retry after poll()). For event loops that must not block on one
  // peer (gradlaned).
  std::optional<OpId> try_send(std::span<const std::byte> message);
  // The next message, or nullopt when none has arrived (drives progress once).
  std::optional<std::vector<std::byte>> try_receive();
  std::vector<std::byte> receive(Millis timeout);

  // ---- doorbells (receiver side of WRITE_WITH_IMM) ----
  std::optional<Doorbell> try_doorbell();
  // The next doorbell progress already reaped (try_receive(), try_doorbell(), a shared
  // CompletionQueue's poll), without driving it: a caller that took this connection's messages
  // until none was left has seen every message the peer sent ahead of such a doorbell (RC
  // delivers them in order, and one poll reaps both).
  std::optional<Doorbell> take_reaped_doorbell();
  Doorbell wait_doorbell(Millis timeout);

  // ---- region descriptors, exchanged once per (region, peer) ----
  void advertise(std::uint32_t region_id, const RegionDescriptor& region);
  RegionDescriptor wait_region(std::uint32_t region_id, Millis timeout);

  // ---- progress ----
  // Reaps completions and connection events; returns how many completions it reaped (on a
  // shared CompletionQueue: those of every connection on it). Throws the connection's failure
  // once failed.
  int poll();
  // True when messages or doorbells were reaped and not yet taken, or the connection failed —
  // without polling: after one CompletionQueue::poll(), a server visits only these.
  bool has_pending_input() const;
  // Sleeps until something may have arrived for this connection (a completion, so a message
  // or a doorbell, or an rdma_cm event such as a disconnect), or at most `timeout`; false when
  // nothing came. It may return early with nothing (a signal; every 60 ms while a leaving peer's
  // last completions are awaited): loop on your own deadline. Take what came with
  // try_receive() / try_doorbell(). For a loop that waits on one connection without spinning:
  // it sleeps on the connection's completion channel. A connection on a shared CompletionQueue
  // naps 1 ms at most instead (wait on the queue).
  bool wait_for_activity(Millis timeout);
  // Waits until operation `op` (and, RC being ordered, everything posted before it) completed.
  // `op` must have been posted signalled, or be followed by a signalled operation.
  void wait(OpId op, Millis timeout);
  // Waits until every operation posted so far completed. When the newest ones went
  // unsignalled, first posts a signalled zero-length WRITE behind them (to the last write's
  // remote address and rkey) whose completion proves them done.
  void flush(Millis timeout);
  // A liveness probe: a signalled zero-length RDMA WRITE with no address or key (IB C9-88:
  // the responder validates neither), which touches no memory and consumes no receive at the
  // peer. Its completion proves the peer's QP alive; a peer that vanished without a
  // disconnect (its host or its link gone: nothing else would tell an idle connection) fails
  // the connection within the ACK timeout and its retries, reported by poll() as any failure.
  OpId probe();
  // Operations posted but not yet known complete.
  std::uint64_t outstanding() const;

  // Ends the connection from this side now (the destructor does it too): the peer sees
  // DISCONNECTED at once, or when its link comes back — where a connection merely written off
  // here would leave it waiting for its timeouts. Operations posted after it fail. Idempotent.
  void close() noexcept;

  // ---- state ----
  bool failed() const;
  // The error that failed the connection, or nullptr.
  const Error* failure() const;
  // Called once, from inside poll()/wait*, when the connection fails.
  void on_failure(std::function<void(const Error&)> handler);
  // "198.18.0.1:7471 -> 198.18.0.1:45012" (local -> remote), for messages.
  const std::string& describe() const;
  const TransportOptions& options() const;
  const ConnectionStats& stats() const;
  // How long this side tells a sender to wait before it tries again when no receive is posted
  // here ("receiver not ready"), as the queue pair holds it now (ibv_query_qp). gradlane sets
  // 0.64 ms: rdma_cm leaves the IB spec's code 0, which means 655 ms.
  std::chrono::microseconds receiver_not_ready_delay() const;

 private:
  friend class Listener;
  friend struct detail::ConnectionAccess;
  explicit Connection(std::unique_ptr<detail::ConnectionState> state);
  std::unique_ptr<detail::ConnectionState> state_;
};

// Accepts connections on the device's address (or an explicit local address) and port.
class Listener {
 public:
  // port 0 picks a free port (see port()). `address` empty = the device's own address.
  Listener(const Device& device, std::uint16_t port, const TransportOptions& options = {},
           const std::string& address = {});
  Listener(Listener&&) noexcept;
  Listener& operator=(Listener&&) noexcept;
  ~Listener();

  std::uint16_t port() const;
  const std::string& address() const;
  // Connections accepted from now on share `cq` (same device) instead of each having its own
  // completion queue: one poll serves them all, and an idle server can block in cq.wait().
  void use_completion_queue(const CompletionQueue& cq);
  // Waits up to `timeout` for a peer, completes the handshake, returns the connection.
  // Throws Error(timeout) when no peer came.
  Connection accept(Millis timeout);
  // One look without waiting: answers the connect requests queued now and returns a peer
  // whose handshake has completed, if any (a request answered now completes on a later look).
  // For a server that keeps admitting peers from its poll loop.
  std::optional<Connection> try_accept();

 private:
  std::unique_ptr<detail::ListenerState> state_;
};

// Connects from `device`'s address to a Listener at address:port. Errors, each within
// options.connect_timeout: address_unresolved (not an RDMA-reachable address),
// route_unresolved, connection_rejected (nothing listens on that port, or the peer refused),
// unreachable (no answer).
Connection connect(const Device& device, const std::string& address, std::uint16_t port,
                   const TransportOptions& options = {});
// The same, with the connection's completions on the shared queue `cq` (same device).
Connection connect(const Device& device, const std::string& address, std::uint16_t port,
                   const TransportOptions& options, const CompletionQueue& cq);

}  // namespace gradlane
