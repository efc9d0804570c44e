// Internal: the completion queue that many connections share (public face:
// include/gradlane/completion_queue.hpp), and the CQ deleter both kinds of queue use.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "gradlane/completion_queue.hpp"
#include "gradlane/device.hpp"

namespace gradlane::detail {

class ConnectionState;

struct DestroyCq { void operator()(ibv_cq* cq) const noexcept; };
struct DestroyCompChannel { void operator()(ibv_comp_channel* channel) const noexcept; };
using CqPtr = std::unique_ptr<ibv_cq, DestroyCq>;
using CompChannelPtr = std::unique_ptr<ibv_comp_channel, DestroyCompChannel>;

class SharedCq {
 public:
  SharedCq(const Device& device, std::uint32_t entries);
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

  // Members in construction order: the channel outlives the CQ that reports to it.
  Device device;
  CompChannelPtr channel;
  CqPtr cq;

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
