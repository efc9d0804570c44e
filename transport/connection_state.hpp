// Internal: everything one Connection owns, in the order it must be torn down.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradlane/connection.hpp"
#include "gradlane/device.hpp"
#include "gradlane/memory.hpp"
#include "memory/window_handle.hpp"
#include "transport/error_text.hpp"
#include "transport/shared_cq.hpp"
#include "transport/wire.hpp"

namespace gradlane::detail {

struct DestroyChannel {
  void operator()(rdma_event_channel* channel) const noexcept;
};
// Destroys the id's QP (if any) first: rdma_destroy_id does not.
struct DestroyId {
  void operator()(rdma_cm_id* id) const noexcept;
};

using ChannelPtr = std::unique_ptr<rdma_event_channel, DestroyChannel>;
using IdPtr = std::unique_ptr<rdma_cm_id, DestroyId>;

// An event channel whose fd is non-blocking, so every wait on it is a bounded poll().
ChannelPtr make_channel();
// Waits up to `timeout` for the next rdma_cm event on `channel`; acks it and returns a copy of
// what matters. nullopt on timeout.
struct CmEvent {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id* id = nullptr;  // the id the event is for (a new id for CONNECT_REQUEST)
  std::vector<std::byte> private_data;
};
std::optional<CmEvent> next_cm_event(rdma_event_channel* channel, std::chrono::milliseconds timeout);

std::string address_text(const sockaddr* addr);

// IPv4 literal + port → sockaddr. Names are resolved with getaddrinfo, IPv4 only: rxe and
// RoCE v2 GIDs used here are IPv4-mapped. `role` names the address in the error.
sockaddr_in make_address(const std::string& host, std::uint16_t port, const char* role);
// The device's GID's IPv4 address, rdma_cm's source; Error(no_usable_gid) without one.
std::string source_address_of(const Device& dev);
// Error(invalid_argument) when rdma_cm bound `id` (for `address`) to another device.
void require_device(const rdma_cm_id* id, const Device& device, const std::string& address);
// Error(invalid_argument) when `cq` belongs to another device than `device`.
void require_same_device(const Device& device, const CompletionQueue& cq);
rdma_conn_param connection_parameters(const Device& device, const TransportOptions& options,
                                      std::span<const std::byte> private_data);

class ConnectionState;
// A connection's state before its QP: options validated, an event channel of its own.
std::unique_ptr<ConnectionState> new_state(const Device& device, const TransportOptions& options);
// Sets state.description: "device local -> peer".
void describe(ConnectionState& state);

class ConnectionState {
 public:
  // Members in construction order; destruction runs bottom-up: QP+id, then CQ, then its
  // completion channel, then the registered rings, then the rdma_cm channel, then our
  // reference on the device.
  Device device;
  TransportOptions options;
  // A completion queue shared with other connections (Listener::use_completion_queue,
  // connect(..., cq)); null: this connection has its own `cq`. Outlives the QP.
  std::shared_ptr<SharedCq> shared;
  ChannelPtr channel;
  std::optional<Buffer> recv_ring_memory;
  std::optional<Buffer> send_ring_memory;
  std::optional<MemoryRegion> recv_ring;
  std::optional<MemoryRegion> send_ring;
  // A connection with its own `cq` sleeps on this channel when a wait outlasts its spin
  // (block()); it outlives the CQ that reports to it. Unused on a shared queue.
  CompChannelPtr completion_channel;
  unsigned unacked_cq_events = 0;  // acknowledged in batches, and all before the CQ goes
  CqPtr cq;
  IdPtr id;

  std::string description;
  bool established = false;

  // ---- send queue accounting ----
  std::vector<OpRecord> ops;          // indexed by op id % send_queue_depth
  OpId next_op = 1;                   // id the next post gets
  OpId completed = 0;                 // every op ≤ this is known complete (RC completes in order)
  OpId last_signalled = 0;            // newest signalled op posted
  std::uint32_t unsignalled_run = 0;  // unsignalled ops since the last signalled one
  std::vector<OpId> send_slot_op;     // control-message send slot → op that uses it (0 = free)
  std::uint32_t next_send_slot = 0;

  // ---- receive side ----
  std::deque<std::vector<std::byte>> messages;
  std::deque<Doorbell> doorbells;
  std::map<std::uint32_t, RegionDescriptor> regions;

  std::optional<Error> failure_error;
  // The peer disconnected; its last messages are still being reaped (handle_cm_events).
  std::optional<Error> disconnecting;
  std::chrono::steady_clock::time_point disconnect_seen;
  // Fails the connection once its peer's disconnect is older than the grace for its last
  // completions (a clock read, only while disconnecting).
  void end_disconnect_grace();
  std::function<void(const Error&)> failure_handler;
  std::uint32_t idle_polls = 0;
  ConnectionStats stats;
  // Memory windows bound on this QP (weakly: they belong to their MemoryWindow). The
  // destructor revokes those still bound here before the QP goes (memory/window_handle.hpp).
  std::vector<std::weak_ptr<WindowHandle>> bound_windows;
  void revoke_windows() noexcept;

  ConnectionState(const Device& dev, const TransportOptions& opts) : device(dev), options(opts) {}
  ~ConnectionState();
  // rdma_disconnect once, if established; never throws.
  void disconnect() noexcept;

  // Bytes of one control-message ring slot: a whole max_message_bytes payload plus the frame
  // header, so a message of exactly max_message_bytes fits (the header says "≤").
  std::size_t slot_bytes() const { return std::size_t{options.max_message_bytes} + kFrameHeaderSize; }
  // Entries this connection may need in its completion queue.
  int cq_entries() const {
    return static_cast<int>(options.send_queue_depth + (uses_shared_receives() ? 0 : options.recv_queue_depth));
  }
  // Receives come from the shared CompletionQueue's SRQ (none posted per connection).
  bool uses_shared_receives() const { return shared && shared->srq; }
  // Messages or doorbells already reaped and not yet taken, or a failure to report.
  bool has_pending_input() const { return !messages.empty() || !doorbells.empty() || failure_error.has_value(); }
  // Creates CQ, QP and the control rings on `id`, posts every receive, sets the ACK timeout.
  void create_queue_pair();
  // Once the queue pair is ready to send (RTS: rdma_accept returned, or ESTABLISHED on the
  // connecting side): sets the delay this side asks of a sender it refuses for want of a
  // receive to kRnrDelayCode.
  void shorten_receiver_not_ready_delay();
  void post_receive(std::uint32_t slot);
  // Records the failure (first one wins), calls the handler once, returns the error to throw.
  const Error& fail(Error error);
  void throw_if_failed() const {
    if (failure_error) throw *failure_error;
  }
  void handle_completion(const ibv_wc& wc);
  void take_receive(const ibv_wc& wc, std::uint32_t slot);
  void handle_cm_events();
  // Posts one send-queue work request, choosing whether to signal it.
  OpId post(ibv_send_wr& wr, const OpRecord& record, bool force_signal);
  // Posts `first` and `second` chained in one ibv_post_send (one doorbell to the NIC); the
  // first follows the automatic signalling, the second is signalled. Returns the second's id.
  OpId post_pair(ibv_send_wr& first, const OpRecord& first_record, ibv_send_wr& second, const OpRecord& second_record);
  bool prepare(ibv_send_wr& wr, const OpRecord& record, bool force_signal, OpId op);
  void posted(OpId op, bool signalled);
  // Waits until `ops` more operations fit in the send queue.
  void wait_for_send_queue_space(std::uint64_t ops = 1);
  int poll_once();
  // Whether block() can sleep on this connection's own completion channel.
  bool can_block() const { return completion_channel != nullptr; }
  // Sleeps until a completion of this connection or one of its rdma_cm events may have
  // arrived, or `timeout` passed; false on timeout. Needs can_block().
  bool block(std::chrono::milliseconds timeout);
};

// Makes a Connection from its state (the constructor is private to the public API).
struct ConnectionAccess {
  static Connection make(std::unique_ptr<ConnectionState> state) { return Connection(std::move(state)); }
};

}  // namespace gradlane::detail
