// The data path: posting work requests, reaping completions, and the waits built on them.
//
// Send-queue accounting: every posted operation gets an increasing OpId (its wr_id). Most
// writes are unsignalled — a completion per write would cost a CQE and a poll each — and one
// in every `signal_interval` is signalled. RC completes in order, so the completion of op N
// proves every op ≤ N done; `completed` tracks that and frees send-queue space.
#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <fmt/format.h>

#include "common/back_off.hpp"
#include "common/syscall_error.hpp"
#include "gradlane/connection.hpp"
#include "transport/connection_state.hpp"
#include "transport/wire.hpp"

namespace gradlane {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

// Receive work requests carry this bit in wr_id, send-queue ones never do.
// How many empty CQ polls between looks at the rdma_cm channel (a syscall): often enough to
// see a DISCONNECTED within microseconds of idling, rare enough to stay off the hot path.
constexpr std::uint32_t kPollsPerEventCheck = 256;
// How many empty CQ polls between two clock reads while waiting: a read costs over a
// microsecond under some VMs' clock sources, an empty poll ~50 ns, so a wait overshoots its
// deadline by a few microseconds at most.
constexpr std::uint32_t kPollsPerClockRead = 64;
// Empty polls per look once napping: fewer than kPollsPerClockRead (64 polls cost tens of
// microseconds under TCG, which made a long wait's CPU ~0.1 s per second), enough that the
// rdma_cm channel (every kPollsPerEventCheck polls) is still read every ~16 naps (~16 ms).
constexpr std::uint32_t kPollsPerNap = 16;

// After a peer's disconnect, how long an empty completion queue is reaped on before the
// connection fails: what the peer sent before leaving completes well within it.
constexpr std::chrono::milliseconds kDisconnectGrace{50};

// How long a full send queue may make no progress before we give up: the QP itself fails
// after ack timeout × (retries + 1) when the peer is gone, so twice that plus a second.
std::chrono::milliseconds stall_limit(const TransportOptions& o) {
  const double ack_seconds = 4.096e-6 * static_cast<double>(1ull << o.ack_timeout);
  return std::chrono::milliseconds(static_cast<long>(ack_seconds * (o.retry_count + 1) * 2 * 1000) + 1000);
}

}  // namespace

// Polls until `done()` holds or `limit` has passed; false on timeout. Every wait of the data
// path goes through here: the clock is read once to set the deadline, then only every
// kPollsPerClockRead empty polls. A long wait gives its core away (back_off): with more waiting
// threads than cores, pure spinning starved the threads, and rxe's softirq work, that were to
// answer. Measured over rxe (perf/results/sidecar-load.md): one server, 32 worker threads
// spinning for their grants on 2 vCPUs: 11.6 updates/s, 0.15 of one worker's rate.
//
// A connection with its own completion queue sleeps on its completion channel once the wait
// outlasts the spin (kSpinFor), so a waiter costs nothing until its completion or an rdma_cm
// event arrives. On a shared queue (a server's many connections, one thread) it naps instead.
template <class Done>
bool poll_until(ConnectionState& s, std::chrono::milliseconds limit, Done done) {
  if (done()) return true;
  const auto start = Clock::now();
  const auto deadline = start + limit;
  bool napping = false;
  for (std::uint32_t empty = 0;;) {
    if (s.poll_once() != 0) {
      if (done()) return true;
    } else if (++empty % (napping ? kPollsPerNap : kPollsPerClockRead) == 0) {
      const auto now = Clock::now();
      if (now > deadline) return done();
      if (s.can_block() && now - start >= kSpinFor) {
        // block() reaps what came before it slept: what we wait for may be among it.
        if (s.block(std::chrono::ceil<std::chrono::milliseconds>(deadline - now)) && done()) return true;
      } else {
        napping = back_off(now - start);
      }
    }
  }
}

const Error& ConnectionState::fail(Error error) {
  if (!failure_error) {
    failure_error = std::move(error);
    if (failure_handler) failure_handler(*failure_error);
  }
  return *failure_error;
}

void ConnectionState::post_receive(std::uint32_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(recv_ring->data()) + std::uint64_t{slot} * slot_bytes();
  sge.length = static_cast<std::uint32_t>(slot_bytes());
  sge.lkey = recv_ring->lkey();
  ibv_recv_wr wr{};
  wr.wr_id = kRecvTag | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(id->qp, &wr, &bad); rc != 0) {
    throw fail(Error(Errc::system, call_failed(fmt::format("ibv_post_recv on {}", description), rc), rc));
  }
}

// One receive completion: a doorbell, or a control message copied out of its buffer.
void ConnectionState::take_receive(const ibv_wc& wc, std::uint32_t slot) {
  if (wc.status != IBV_WC_SUCCESS) {
    // After the peer's disconnect, the flush that follows what arrived before it (see
    // handle_completion). Otherwise a flushed receive just means the QP failed; the send side
    // or the cm event says why.
    if (disconnecting) {
      fail(*disconnecting);
    } else if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      fail(completion_error(wc.status, wc.vendor_err, "receive", description));
    }
    return;
  }
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    doorbells.push_back({ntohl(wc.imm_data), wc.byte_len});
    ++stats.doorbells_received;
  } else {
    const auto* base =
        uses_shared_receives() ? shared->shared_slot(slot) : recv_ring->data() + std::uint64_t{slot} * slot_bytes();
    try {
      const Frame frame = decode_frame({base, wc.byte_len});
      if (frame.kind == FrameKind::region) {
        const RegionAdvert advert = decode_region_advert(frame.payload);
        regions[advert.id] = advert.region;
      } else {
        messages.emplace_back(frame.payload.begin(), frame.payload.end());
        ++stats.messages_received;
      }
    } catch (const Error& e) {
      fail(Error(Errc::protocol, fmt::format("malformed control message from {}: {}", description, e.what())));
      return;
    }
  }
}

void ConnectionState::handle_completion(const ibv_wc& wc) {
  if (wc.wr_id & kRecvTag) {
    const auto slot = static_cast<std::uint32_t>(wc.wr_id & ~kRecvTag);
    take_receive(wc, slot);
    // The buffer was copied out: a shared receive's goes back to the shared queue whatever
    // became of this connection (the others need it); our own only while we live, and never
    // after a flush (the QP is in error: a repost would be flushed at once, forever).
    if (uses_shared_receives()) {
      shared->post_shared_receive(slot);
    } else if (wc.status == IBV_WC_SUCCESS && !failure_error) {
      post_receive(slot);
    }
    return;
  }
  if (wc.status != IBV_WC_SUCCESS && disconnecting) {
    // The QP was moved to the error state on the peer's disconnect: this flush comes after
    // every completion of what arrived before it, which has been delivered. Now it fails.
    fail(*disconnecting);
    return;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    const OpRecord& op = ops[wc.wr_id % ops.size()];
    const std::string what = fmt::format("{} (op {})", describe_op(op), wc.wr_id);
    fail(wc.status == IBV_WC_WR_FLUSH_ERR && !failure_error
             ? silent_flush_error(what, description)
             : completion_error(wc.status, wc.vendor_err, what, description));
    return;
  }
  completed = std::max<OpId>(completed, wc.wr_id);
  stats.completed = completed;
}

void ConnectionState::handle_cm_events() {
  while (auto event = next_cm_event(channel.get(), std::chrono::milliseconds(0))) {
    if (event->type == RDMA_CM_EVENT_ESTABLISHED) continue;
    Error error = cm_event_error(event->type, event->status, CmPhase::established, description);
    const bool peer_left = event->type == RDMA_CM_EVENT_DISCONNECTED || event->type == RDMA_CM_EVENT_TIMEWAIT_EXIT;
    if (!peer_left || failure_error) {
      fail(std::move(error));
      continue;
    }
    if (disconnecting) continue;
    // A peer that sends its last message and exits can have its disconnect seen here before
    // that message's completion is reaped: failing now would lose the message (a flaky
    // "disconnected" instead of the peer's last word). Instead the QP goes to the error state
    // and completions are reaped on: the connection fails at the first flush completion
    // (handle_completion), or once the queue stayed empty for kDisconnectGrace (rxe in Linux
    // 6.1 flushes no posted receives).
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(id->qp, &attr, IBV_QP_STATE) != 0) {
      fail(std::move(error));
      continue;
    }
    disconnecting = std::move(error);
    disconnect_seen = Clock::now();
  }
}

void ConnectionState::end_disconnect_grace() {
  if (disconnecting && !failure_error && Clock::now() - disconnect_seen > kDisconnectGrace) fail(*disconnecting);
}

int ConnectionState::poll_once() {
  throw_if_failed();
  int n = 0;
  if (shared) {
    n = shared->poll();  // every attached connection's completions, each to its owner
  } else {
    ibv_wc wcs[16];
    n = ibv_poll_cq(cq.get(), 16, wcs);
    if (n < 0) throw fail(Error(Errc::system, fmt::format("ibv_poll_cq on {} failed ({})", description, n)));
    for (int i = 0; i < n; ++i) handle_completion(wcs[i]);
  }
  end_disconnect_grace();
  if (n == 0 && ++idle_polls % kPollsPerEventCheck == 0) handle_cm_events();
  // What was reaped is delivered before a failure is thrown (the next call throws it).
  if (n == 0) throw_if_failed();
  return n;
}

bool ConnectionState::block(std::chrono::milliseconds timeout) {
  if (int rc = ibv_req_notify_cq(cq.get(), 0); rc != 0) {
    throw fail(Error(Errc::system, call_failed(fmt::format("ibv_req_notify_cq on {}", description), rc)));
  }
  // Completions that arrived before the queue was armed raise no event: look once more.
  if (poll_once() > 0) return true;
  handle_cm_events();  // a disconnect that came while we spun
  if (failure_error) return true;
  // A peer that left: its connection fails once the grace for its last completions is over.
  if (disconnecting) timeout = std::min(timeout, kDisconnectGrace + std::chrono::milliseconds(10));
  pollfd fds[2] = {{completion_channel->fd, POLLIN, 0}, {channel->fd, POLLIN, 0}};
  const int rc = sleep_on_channels(fds, timeout);
  if (rc < 0 && errno != EINTR) throw fail(Error(Errc::system, call_failed("poll(completion channel)", errno)));
  if (rc <= 0) return false;
  if (fds[0].revents & POLLIN) take_cq_event(*completion_channel, cq.get(), unacked_cq_events);
  if (fds[1].revents != 0) handle_cm_events();
  return true;
}

void ConnectionState::wait_for_send_queue_space(std::uint64_t wanted) {
  // The clock is read only once the queue is actually full: posting stays free of clock reads
  // (under some VMs' clock sources a read costs over a microsecond).
  const auto fits = [&] { return next_op - 1 - completed + wanted <= options.send_queue_depth; };
  if (fits()) return;
  const auto limit = stall_limit(options);
  if (!poll_until(*this, limit, fits)) {
    throw fail(Error(Errc::timeout, fmt::format("send queue of {} stayed full ({} ops outstanding) for {} ms: the peer "
                                                "stopped acknowledging",
                                                description, next_op - 1 - completed, limit.count())));
  }
}

// Numbers `wr` as op `op` and decides whether it is signalled (the accounting is committed
// by posted(), once the NIC took it).
bool ConnectionState::prepare(ibv_send_wr& wr, const OpRecord& record, bool force_signal, OpId op) {
  const bool signal = force_signal || unsignalled_run + 1 >= options.signal_interval;
  wr.wr_id = op;
  wr.send_flags |= signal ? IBV_SEND_SIGNALED : 0;
  ops[op % ops.size()] = record;
  return signal;
}

void ConnectionState::posted(OpId op, bool signalled) {
  next_op = op + 1;
  ++stats.posted;
  if (signalled) {
    unsignalled_run = 0;
    last_signalled = op;
    ++stats.signalled;
  } else {
    ++unsignalled_run;
  }
}

OpId ConnectionState::post(ibv_send_wr& wr, const OpRecord& record, bool force_signal) {
  throw_if_failed();
  wait_for_send_queue_space();
  const OpId op = next_op;
  const bool signal = prepare(wr, record, force_signal, op);
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(id->qp, &wr, &bad); rc != 0) {
    throw Error(Errc::system, call_failed(fmt::format("ibv_post_send({}) on {}", describe_op(record), description), rc),
                rc);
  }
  posted(op, signal);
  return op;
}

OpId ConnectionState::post_pair(ibv_send_wr& first, const OpRecord& first_record, ibv_send_wr& second,
                                const OpRecord& second_record) {
  throw_if_failed();
  wait_for_send_queue_space(2);
  const OpId op = next_op;
  const bool first_signalled = prepare(first, first_record, false, op);
  prepare(second, second_record, true, op + 1);
  first.next = &second;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(id->qp, &first, &bad); rc != 0) {
    if (bad == &second) posted(op, first_signalled);  // the NIC took the first one
    throw Error(Errc::system,
                call_failed(fmt::format("ibv_post_send({} + {}) on {}", describe_op(first_record),
                                        describe_op(second_record), description),
                            rc),
                rc);
  }
  posted(op, first_signalled);
  posted(op + 1, true);
  return op + 1;
}

}  // namespace detail

Connection::Connection(std::unique_ptr<detail::ConnectionState> state) : state_(std::move(state)) {}
Connection::Connection(Connection&&) noexcept = default;
Connection& Connection::operator=(Connection&&) noexcept = default;
Connection::~Connection() = default;

namespace {

// How long a blocking send() waits for a free control-message slot before giving up.
constexpr std::chrono::milliseconds kSendSlotWait{10'000};

// Posts `payload` as one framed SEND when a control-message slot and a send-queue entry are
// free; nullopt (nothing posted) when not. Never waits.
std::optional<OpId> try_send_frame(detail::ConnectionState& s, detail::FrameKind kind,
                                   std::span<const std::byte> payload) {
  s.throw_if_failed();
  const std::size_t slot_bytes = s.slot_bytes();
  if (payload.size() > s.options.max_message_bytes) {
    throw Error(Errc::invalid_argument,
                fmt::format("control message of {} bytes exceeds max_message_bytes ({}, GRADLANE_MAX_MESSAGE) on {}",
                            payload.size(), s.options.max_message_bytes, s.description));
  }
  const std::uint32_t slot = s.next_send_slot;
  // The slot is free once the SEND that last used it completed (sends are always signalled).
  if (s.send_slot_op[slot] != 0 && s.send_slot_op[slot] > s.completed) return std::nullopt;
  if (s.next_op - 1 - s.completed + 1 > s.options.send_queue_depth) return std::nullopt;
  std::byte* out = s.send_ring->data() + std::uint64_t{slot} * slot_bytes;
  const std::size_t length = detail::encode_frame(kind, payload, {out, slot_bytes});
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(out), static_cast<std::uint32_t>(length), s.send_ring->lkey()};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (length <= s.options.max_inline) wr.send_flags = IBV_SEND_INLINE;
  const OpId op = s.post(wr, {IBV_WR_SEND, length, 0, 0}, true);
  s.send_slot_op[slot] = op;
  s.next_send_slot = (slot + 1) % static_cast<std::uint32_t>(s.send_slot_op.size());
  return op;
}

OpId send_frame(detail::ConnectionState& s, detail::FrameKind kind, std::span<const std::byte> payload) {
  std::optional<OpId> op;
  if (!detail::poll_until(s, kSendSlotWait, [&] { return (op = try_send_frame(s, kind, payload)).has_value(); })) {
    throw Error(Errc::timeout, fmt::format("no free control-message slot on {} for {} ms: the peer stopped "
                                           "acknowledging (a stopped process, or a full receive queue)",
                                           s.description, kSendSlotWait.count()));
  }
  return *op;
}

}  // namespace

namespace {

template <class Result, class Take>
Result wait_until(detail::ConnectionState& s, Millis timeout, const char* what, Take take) {
  std::optional<Result> got;
  if (!detail::poll_until(s, timeout, [&] { return (got = take()).has_value(); })) {
    throw Error(Errc::timeout, fmt::format("no {} on {} within {} ms", what, s.description, timeout.count()));
  }
  return std::move(*got);
}

// The oldest of a queue of arrivals (messages, doorbells), taken out of it.
template <class T>
std::optional<T> take_front(std::deque<T>& queue) {
  if (queue.empty()) return std::nullopt;
  T front = std::move(queue.front());
  queue.pop_front();
  return front;
}

}  // namespace

OpId Connection::send(std::span<const std::byte> message) {
  return send_frame(*state_, detail::FrameKind::message, message);
}

std::optional<OpId> Connection::try_send(std::span<const std::byte> message) {
  auto& s = *state_;
  if (auto op = try_send_frame(s, detail::FrameKind::message, message)) return op;
  s.poll_once();  // frees slots whose SENDs completed since
  return try_send_frame(s, detail::FrameKind::message, message);
}

std::optional<std::vector<std::byte>> Connection::try_receive() {
  auto& s = *state_;
  if (s.messages.empty()) s.poll_once();
  return take_front(s.messages);
}

std::vector<std::byte> Connection::receive(Millis timeout) {
  auto& s = *state_;
  return wait_until<std::vector<std::byte>>(s, timeout, "control message", [&] { return take_front(s.messages); });
}

std::optional<Doorbell> Connection::try_doorbell() {
  auto& s = *state_;
  if (s.doorbells.empty()) s.poll_once();
  return take_front(s.doorbells);
}

std::optional<Doorbell> Connection::take_reaped_doorbell() { return take_front(state_->doorbells); }

Doorbell Connection::wait_doorbell(Millis timeout) {
  auto& s = *state_;
  return wait_until<Doorbell>(s, timeout, "WRITE_WITH_IMM doorbell", [&] { return take_front(s.doorbells); });
}

void Connection::advertise(std::uint32_t region_id, const RegionDescriptor& region) {
  const auto advert = detail::encode_region_advert(region_id, region);
  send_frame(*state_, detail::FrameKind::region, advert);
}

RegionDescriptor Connection::wait_region(std::uint32_t region_id, Millis timeout) {
  auto& s = *state_;
  const std::string what = fmt::format("advertisement of region {}", region_id);
  return wait_until<RegionDescriptor>(s, timeout, what.c_str(), [&]() -> std::optional<RegionDescriptor> {
    auto it = s.regions.find(region_id);
    if (it == s.regions.end()) return std::nullopt;
    return it->second;
  });
}

int Connection::poll() { return state_->poll_once(); }
bool Connection::has_pending_input() const { return state_->has_pending_input(); }

void Connection::wait(OpId op, Millis timeout) {
  auto& s = *state_;
  if (op >= s.next_op) throw Error(Errc::invalid_argument, fmt::format("wait: op {} was never posted", op));
  if (op > s.last_signalled) {
    throw Error(Errc::invalid_argument,
                fmt::format("wait: op {} was posted unsignalled and no signalled op follows it, so no completion "
                            "will report it; post it (or a later op) with Signal::always",
                            op));
  }
  if (!detail::poll_until(s, timeout, [&] { return s.completed >= op; })) {
    throw Error(Errc::timeout,
                fmt::format("{} (op {}) not complete on {} after {} ms", detail::describe_op(s.ops[op % s.ops.size()]),
                            op, s.description, timeout.count()));
  }
}

void Connection::flush(Millis timeout) {
  auto& s = *state_;
  const OpId last = s.next_op - 1;
  if (last == 0) return;
  if (last > s.last_signalled) {
    // The newest operations went unsignalled, so no completion would report them: post a
    // signalled zero-length WRITE behind them. RC completes in order, so its completion
    // proves them done. Only writes go unsignalled (READs and SENDs never do; a window's
    // LOCAL_INV may, but only chained before its signalled BIND), so the last op names a
    // remote address and rkey of the peer's that a zero-byte write may carry.
    const detail::OpRecord& record = s.ops[last % s.ops.size()];
    ibv_send_wr marker{};
    marker.opcode = IBV_WR_RDMA_WRITE;
    marker.num_sge = 0;
    marker.wr.rdma.remote_addr = record.remote_addr;
    marker.wr.rdma.rkey = record.rkey;
    s.post(marker, {IBV_WR_RDMA_WRITE, 0, record.remote_addr, record.rkey}, true);
  }
  wait(s.next_op - 1, timeout);
}

OpId Connection::probe() {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.num_sge = 0;
  return state_->post(wr, {IBV_WR_RDMA_WRITE, 0, 0, 0}, true);
}

std::uint64_t Connection::outstanding() const { return state_->next_op - 1 - state_->completed; }
bool Connection::failed() const { return state_->failure_error.has_value(); }
void Connection::close() noexcept { state_->disconnect(); }
const Error* Connection::failure() const { return state_->failure_error ? &*state_->failure_error : nullptr; }
void Connection::on_failure(std::function<void(const Error&)> handler) { state_->failure_handler = std::move(handler); }
const std::string& Connection::describe() const { return state_->description; }
const TransportOptions& Connection::options() const { return state_->options; }
const ConnectionStats& Connection::stats() const { return state_->stats; }

bool Connection::wait_for_activity(Millis timeout) {
  auto& s = *state_;
  if (s.poll_once() > 0 || s.has_pending_input()) return true;
  if (s.can_block()) return s.block(timeout);
  std::this_thread::sleep_for(std::min(timeout, Millis(1)));  // a shared queue: its owner waits on it
  return s.poll_once() > 0;
}

}  // namespace gradlane
