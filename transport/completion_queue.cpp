// The shared completion queue: one CQ (and its completion channel) for many connections, with
// each completion handed to the connection whose QP it names.
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <fmt/format.h>
#include <vector>

#include "common/syscall_error.hpp"
#include "transport/connection_state.hpp"
#include "transport/shared_cq.hpp"

namespace gradlane {
namespace detail {
namespace {

// Polls between looks at the attached connections' rdma_cm events (a syscall each).
constexpr std::uint32_t kPollsPerEventCheck = 256;

}  // namespace

void DestroyCompChannel::operator()(ibv_comp_channel* channel) const noexcept {
  if (int rc = ibv_destroy_comp_channel(channel); rc != 0) {
    std::fprintf(stderr, "gradlane: %s\n", call_failed("ibv_destroy_comp_channel", rc).c_str());
  }
}

void DestroySrq::operator()(ibv_srq* srq) const noexcept {
  if (int rc = ibv_destroy_srq(srq); rc != 0) {
    std::fprintf(stderr, "gradlane: %s\n", call_failed("ibv_destroy_srq", rc).c_str());
  }
}

CompChannelPtr make_completion_channel(const Device& device) {
  CompChannelPtr channel(ibv_create_comp_channel(device.context()));
  if (!channel) {
    throw_call_failed(Errc::system, fmt::format("ibv_create_comp_channel({})", device.info().name),
                      last_errno_or(ENOMEM));
  }
  const int flags = ::fcntl(channel->fd, F_GETFL);
  if (flags < 0 || ::fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw_call_failed(Errc::system, "fcntl(completion channel, O_NONBLOCK)", errno);
  }
  return channel;
}

void take_cq_event(ibv_comp_channel& channel, ibv_cq* cq, unsigned& unacked) {
  constexpr unsigned kEventsPerAck = 64;
  ibv_cq* event_cq = nullptr;
  void* context = nullptr;
  if (ibv_get_cq_event(&channel, &event_cq, &context) == 0 && ++unacked >= kEventsPerAck) {
    ibv_ack_cq_events(cq, unacked);
    unacked = 0;
  }
}

int sleep_on_channels(std::span<pollfd> fds, std::chrono::milliseconds timeout) noexcept {
  const auto ms = std::clamp<std::int64_t>(timeout.count(), 0, std::numeric_limits<int>::max());
  return ::poll(fds.data(), fds.size(), static_cast<int>(ms));
}

SharedCq::SharedCq(const Device& dev, std::uint32_t entries, std::uint32_t shared_receives, std::size_t slot_bytes)
    : device(dev), channel(make_completion_channel(dev)) {
  // The shared receives complete on this queue too: room for all of them, always.
  reserved_ = static_cast<int>(shared_receives);
  capacity_ = static_cast<int>(std::max<std::uint32_t>(entries, 1) + shared_receives);
  cq.reset(ibv_create_cq(device.context(), capacity_, nullptr, channel.get(), 0));
  if (!cq) {
    throw_call_failed(Errc::system, fmt::format("ibv_create_cq({}, {} entries, shared)", device.info().name, capacity_),
                      last_errno_or(ENOMEM));
  }
  capacity_ = cq->cqe;
  if (shared_receives == 0) return;
  ibv_srq_init_attr attr{};
  attr.attr.max_wr = shared_receives;
  attr.attr.max_sge = 1;
  srq.reset(ibv_create_srq(device.pd(), &attr));
  if (!srq) {
    throw_call_failed(Errc::system,
                      fmt::format("ibv_create_srq({}, {} receives) — the device may not support shared receive "
                                  "queues, or fewer: use per-connection receives (shared_receives = 0)",
                                  device.info().name, shared_receives),
                      last_errno_or(EINVAL));
  }
  srq_depth = shared_receives;
  srq_slot_bytes = slot_bytes;
  srq_memory = Buffer::allocate(slot_bytes * shared_receives, Buffer::Pages::small_only);
  srq_ring = MemoryRegion::register_buffer(device, *srq_memory, Access::local_write);
  for (std::uint32_t i = 0; i < shared_receives; ++i) post_shared_receive(i);
}

void SharedCq::post_shared_receive(std::uint32_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(srq_memory->data()) + std::uint64_t{slot} * srq_slot_bytes;
  sge.length = static_cast<std::uint32_t>(srq_slot_bytes);
  sge.lkey = srq_ring->lkey();
  ibv_recv_wr wr{};
  wr.wr_id = kRecvTag | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_srq_recv(srq.get(), &wr, &bad); rc != 0) {
    throw_call_failed(Errc::system, fmt::format("ibv_post_srq_recv on {}", device.info().name), rc);
  }
}

std::uint64_t SharedCq::receive_buffer_bytes() const {
  std::uint64_t bytes = srq ? std::uint64_t{srq_depth} * srq_slot_bytes : 0;
  for (const auto& [qp, owner] : owners_) {
    if (owner->recv_ring_memory) bytes += owner->recv_ring_memory->size();
  }
  return bytes;
}

SharedCq::~SharedCq() {
  if (cq && unacked_events_ > 0) ibv_ack_cq_events(cq.get(), unacked_events_);
}

void SharedCq::attach(std::uint32_t qp_num, ConnectionState& owner, int entries) {
  // A CQ that overflows fails every QP on it: grow it before the new QP can complete anything.
  if (reserved_ + entries > capacity_) {
    const int wanted = reserved_ + entries;
    if (int rc = ibv_resize_cq(cq.get(), wanted); rc != 0) {
      throw_call_failed(Errc::resource_exhausted,
                        fmt::format("ibv_resize_cq({}, {} entries) for connection {} on a shared completion queue "
                                    "— lower GRADLANE_SQ_DEPTH / GRADLANE_RQ_DEPTH",
                                    device.info().name, wanted, owners_.size() + 1),
                        rc);
    }
    capacity_ = cq->cqe;
  }
  reserved_ += entries;
  owners_[qp_num] = &owner;
}

void SharedCq::detach(std::uint32_t qp_num, int entries) {
  if (owners_.erase(qp_num) != 0) reserved_ -= entries;
}

void SharedCq::check_events() {
  // Copied first: a failure handler may destroy a connection (and detach it) meanwhile.
  std::vector<ConnectionState*> owners;
  owners.reserve(owners_.size());
  for (const auto& [qp, owner] : owners_) owners.push_back(owner);
  for (ConnectionState* owner : owners) {
    if (owner->failure_error || !owner->channel) continue;
    try {
      owner->handle_cm_events();
      owner->end_disconnect_grace();
    } catch (const Error& e) {
      owner->fail(e);
    }
  }
}

int SharedCq::poll() {
  ibv_wc wcs[32];
  const int n = ibv_poll_cq(cq.get(), 32, wcs);
  if (n < 0)
    throw Error(Errc::system,
                fmt::format("ibv_poll_cq on the shared completion queue of {} failed ({})", device.info().name, n));
  for (int i = 0; i < n; ++i) {
    const auto owner = owners_.find(wcs[i].qp_num);
    if (owner == owners_.end()) {  // a connection already gone; a shared buffer it took comes back
      if (srq && (wcs[i].wr_id & kRecvTag)) post_shared_receive(static_cast<std::uint32_t>(wcs[i].wr_id & ~kRecvTag));
      continue;
    }
    try {
      owner->second->handle_completion(wcs[i]);
    } catch (const Error& e) {
      owner->second->fail(e);  // that connection's failure, reported by its next call
    }
  }
  // Every so many polls, busy or not: a queue that never runs dry must still see a disconnect.
  if (++polls_ % kPollsPerEventCheck == 0) check_events();
  return n;
}

bool SharedCq::wait(std::chrono::milliseconds timeout) {
  if (int rc = ibv_req_notify_cq(cq.get(), 0); rc != 0) throw_call_failed(Errc::system, "ibv_req_notify_cq", rc);
  // Completions that arrived before the queue was armed raise no event: look once more.
  if (poll() > 0) return true;
  std::vector<pollfd> fds{{channel->fd, POLLIN, 0}};
  bool grace_running = false;  // a peer left; its connection fails once its last completions are in
  for (const auto& [qp, owner] : owners_) {
    owner->end_disconnect_grace();
    grace_running = grace_running || (owner->disconnecting && !owner->failure_error);
    if (owner->channel && !owner->failure_error) fds.push_back({owner->channel->fd, POLLIN, 0});
  }
  if (grace_running) timeout = std::min(timeout, std::chrono::milliseconds(60));
  const int rc = sleep_on_channels(fds, timeout);
  if (rc < 0 && errno != EINTR) throw_call_failed(Errc::system, "poll(completion channel)", errno);
  if (rc <= 0) {
    if (grace_running) check_events();
    return grace_running;  // something changed: a connection may have failed
  }
  if (fds[0].revents & POLLIN) take_cq_event(*channel, cq.get(), unacked_events_);
  for (std::size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents != 0) {
      check_events();
      break;
    }
  }
  return true;
}

}  // namespace detail

CompletionQueue::CompletionQueue(const Device& device, std::uint32_t entries, std::uint32_t shared_receives,
                                 std::uint32_t max_message_bytes)
    : state_(std::make_shared<detail::SharedCq>(device, entries, shared_receives,
                                                std::size_t{max_message_bytes} + detail::kFrameHeaderSize)) {}

int CompletionQueue::poll() { return state_->poll(); }
bool CompletionQueue::wait(std::chrono::milliseconds timeout) { return state_->wait(timeout); }
std::size_t CompletionQueue::connections() const { return state_->connections(); }
std::uint32_t CompletionQueue::shared_receives() const { return state_->srq_depth; }
std::uint64_t CompletionQueue::receive_buffer_bytes() const { return state_->receive_buffer_bytes(); }

}  // namespace gradlane
