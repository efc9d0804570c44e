// Internal: the completion queue that many connections share (public face:
// include/gradlane/completion_queue.hpp), and the CQ deleter both kinds of queue use.
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>

#include "gradlane/completion_queue.hpp"
#include "gradlane/device.hpp"
#include "gradlane/memory.hpp"

namespace gradlane::detail {

class ConnectionState;

// A receive work request's id: this bit, and the ring slot of its buffer (per connection, or
// the shared receive queue's).
inline constexpr std::uint64_t kRecvTag = 1ull << 63;

struct DestroyCq {
  void operator()(ibv_cq* cq) const noexcept;
};
struct DestroyCompChannel {
  void operator()(ibv_comp_channel* channel) const noexcept;
};
struct DestroySrq {
  void operator()(ibv_srq* srq) const noexcept;
};
using CqPtr = std::unique_ptr<ibv_cq, DestroyCq>;
using CompChannelPtr = std::unique_ptr<ibv_comp_channel, DestroyCompChannel>;
using SrqPtr = std::unique_ptr<ibv_srq, DestroySrq>;

// A completion channel whose fd is non-blocking: a wait on it is a bounded poll().
CompChannelPtr make_completion_channel(const Device& device);
// Takes the event `channel` reported for `cq`, if any, and acknowledges `cq`'s events in
// batches (each ack takes a lock in libibverbs): `unacked` counts those taken and not yet
// acknowledged, all of which must be before the CQ is destroyed.
void take_cq_event(ibv_comp_channel& channel, ibv_cq* cq, unsigned& unacked);
// The sleep of a completion-channel wait (a connection's own, or a shared queue's): poll() on
// the channels' fds for at most `timeout` (clamped to poll's range). Returns poll()'s result;
// -1 with errno set on failure, EINTR included (a signal ends the sleep early, like a timeout).
// The caller armed its CQ (ibv_req_notify_cq) and looked at it once more first: completions
// that arrived before the arming raise no event.
int sleep_on_channels(std::span<pollfd> fds, std::chrono::milliseconds timeout) noexcept;

class SharedCq {
 public:
  // shared_receives > 0: a shared receive queue of that many buffers of slot_bytes each.
  SharedCq(const Device& device, std::uint32_t entries, std::uint32_t shared_receives = 0, std::size_t slot_bytes = 0);
  ~SharedCq();  // acknowledges every channel event first: ibv_destroy_cq waits for that
  SharedCq(const SharedCq&) = delete;
  SharedCq& operator=(const SharedCq&) = delete;

  // A connection's QP `qp_num` joins, needing up to `entries` CQ entries (the CQ grows).
  void attach(std::uint32_t qp_num, ConnectionState& owner, int entries);
  void detach(std::uint32_t qp_num, int entries);
  // Reaps up to a batch of completions and hands each to the connection whose QP it names.
  int poll();
  bool wait(std::chrono::milliseconds timeout);
  std::size_t connections() const { return owners_.size(); }
  // Shared receives: the buffer of slot `slot`, and posting it again once its message is taken.
  const std::byte* shared_slot(std::uint32_t slot) const { return srq_memory->data() + slot * srq_slot_bytes; }
  void post_shared_receive(std::uint32_t slot);
  // Receive buffers registered for the attached connections (their own rings, or the SRQ's).
  std::uint64_t receive_buffer_bytes() const;

  // Members in construction order: the channel outlives the CQ that reports to it; the SRQ
  // goes before its registered buffers. Every QP using the SRQ holds this object alive.
  Device device;
  CompChannelPtr channel;
  CqPtr cq;
  std::optional<Buffer> srq_memory;
  std::optional<MemoryRegion> srq_ring;
  SrqPtr srq;
  std::uint32_t srq_depth = 0;
  std::size_t srq_slot_bytes = 0;

 private:
  void check_events();  // every owner's rdma_cm events (a disconnect)
  int capacity_ = 0;    // entries the CQ holds
  int reserved_ = 0;    // entries the attached QPs may need at most
  std::uint32_t polls_ = 0;
  unsigned unacked_events_ = 0;
  std::map<std::uint32_t, ConnectionState*> owners_;  // qp_num -> its connection (not owned)
};

// The transport's access to a CompletionQueue's state.
struct CqAccess {
  static const std::shared_ptr<SharedCq>& state(const CompletionQueue& cq) { return cq.state_; }
};

}  // namespace gradlane::detail
