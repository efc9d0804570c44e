// Connection setup and teardown over librdmacm: resolve address → resolve route → connect on
// the active side; listen → connect request → accept on the passive side. Every step waits on
// a non-blocking event channel with a deadline, so setup never hangs.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>

#include "common/syscall_error.hpp"
#include "gradlane/connection.hpp"
#include "transport/connection_state.hpp"
#include "transport/wire.hpp"

namespace gradlane {
namespace detail {

using Clock = std::chrono::steady_clock;

void DestroyChannel::operator()(rdma_event_channel* channel) const noexcept { rdma_destroy_event_channel(channel); }

void DestroyCq::operator()(ibv_cq* cq) const noexcept {
  if (int rc = ibv_destroy_cq(cq); rc != 0) {
    std::fprintf(stderr, "gradlane: %s\n", call_failed("ibv_destroy_cq", rc).c_str());
  }
}

void DestroyId::operator()(rdma_cm_id* id) const noexcept {
  if (id->qp != nullptr) rdma_destroy_qp(id);
  if (rdma_destroy_id(id) != 0) {
    std::fprintf(stderr, "gradlane: %s\n", call_failed("rdma_destroy_id", errno).c_str());
  }
}

ChannelPtr make_channel() {
  ChannelPtr channel(rdma_create_event_channel());
  if (!channel) {
    throw_call_failed(Errc::system, "rdma_create_event_channel (is /dev/infiniband/rdma_cm present? load rdma_ucm)",
                      last_errno_or(ENODEV));
  }
  const int flags = ::fcntl(channel->fd, F_GETFL);
  if (flags < 0 || ::fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw_call_failed(Errc::system, "fcntl(rdma_cm channel, O_NONBLOCK)", errno);
  }
  return channel;
}

std::optional<CmEvent> next_cm_event(rdma_event_channel* channel, std::chrono::milliseconds timeout) {
  // A zero timeout is the data path's periodic look: no clock reads on that path.
  const auto deadline = timeout.count() > 0 ? Clock::now() + timeout : Clock::time_point{};
  for (;;) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(channel, &event) == 0) {
      CmEvent copy;
      copy.type = event->event;
      copy.status = event->status;
      copy.id = event->id;
      const auto& conn = event->param.conn;
      if (conn.private_data != nullptr && conn.private_data_len > 0 &&
          (event->event == RDMA_CM_EVENT_CONNECT_REQUEST || event->event == RDMA_CM_EVENT_REJECTED ||
           event->event == RDMA_CM_EVENT_ESTABLISHED)) {
        const auto* p = static_cast<const std::byte*>(conn.private_data);
        copy.private_data.assign(p, p + conn.private_data_len);
      }
      // Acked at once: rdma_destroy_id and rdma_migrate_id wait for every reported event's ack.
      if (rdma_ack_cm_event(event) != 0) throw_call_failed(Errc::system, "rdma_ack_cm_event", errno);
      return copy;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) throw_call_failed(Errc::system, "rdma_get_cm_event", errno);
    if (timeout.count() <= 0) return std::nullopt;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd pfd{channel->fd, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(left.count()) + 1);
    if (rc < 0 && errno != EINTR) throw_call_failed(Errc::system, "poll(rdma_cm channel)", errno);
  }
}

std::string address_text(const sockaddr* addr) {
  if (addr == nullptr) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
  }
  return fmt::format("{}:{}", host, port);
}

sockaddr_in make_address(const std::string& host, std::uint16_t port, const char* role) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* result = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &result); rc != 0 || result == nullptr) {
    throw Error(Errc::address_unresolved,
                fmt::format("{} address '{}' is neither an IPv4 address nor a resolvable host name ({})", role, host,
                            rc != 0 ? ::gai_strerror(rc) : "no IPv4 address"));
  }
  addr.sin_addr = reinterpret_cast<const sockaddr_in*>(result->ai_addr)->sin_addr;
  ::freeaddrinfo(result);
  return addr;
}

std::string source_address_of(const Device& dev) {
  const DeviceInfo& info = dev.info();
  if (info.ipv4_address.empty()) {
    throw Error(Errc::no_usable_gid,
                fmt::format("{} GID {} ({}) carries no IPv4 address, which rdma_cm needs as the source; pick "
                            "an IPv4-mapped RoCE v2 GID with -x / GRADLANE_GID_INDEX",
                            info.name, info.gid_index, info.gid));
  }
  return info.ipv4_address;
}

void require_device(const rdma_cm_id* id, const Device& device, const std::string& address) {
  if (id->verbs == nullptr || id->verbs != device.context()) {
    const char* other = id->verbs ? ibv_get_device_name(id->verbs->device) : "no RDMA device";
    throw Error(Errc::invalid_argument,
                fmt::format("address {} belongs to {}, not to the selected device {}: choose the device that "
                            "owns the address (or the address of that device)",
                            address, other, device.info().name));
  }
}

rdma_conn_param connection_parameters(const Device& device, const TransportOptions& options,
                                      std::span<const std::byte> private_data) {
  rdma_conn_param param{};
  param.private_data = private_data.data();
  param.private_data_len = static_cast<std::uint8_t>(private_data.size());
  const auto depth = static_cast<std::uint8_t>(device.info().max_rd_atomic);
  param.responder_resources = depth;
  param.initiator_depth = depth;
  param.retry_count = options.retry_count;
  param.rnr_retry_count = options.rnr_retry;
  return param;
}

std::unique_ptr<ConnectionState> new_state(const Device& device, const TransportOptions& options) {
  options.validate();
  auto state = std::make_unique<ConnectionState>(device, options);
  state->channel = make_channel();
  return state;
}

void describe(ConnectionState& state) {
  state.description =
      fmt::format("{} {} -> {}", state.device.info().name, address_text(rdma_get_local_addr(state.id.get())),
                  address_text(rdma_get_peer_addr(state.id.get())));
}

void ConnectionState::create_queue_pair() {
  const auto& info = device.info();
  if (!shared) {
    completion_channel = make_completion_channel(device);
    cq.reset(ibv_create_cq(device.context(), cq_entries(), nullptr, completion_channel.get(), 0));
    if (!cq) {
      throw_call_failed(Errc::system, fmt::format("ibv_create_cq({}, {} entries)", info.name, cq_entries()),
                        last_errno_or(ENOMEM));
    }
  }
  ibv_cq* completions = shared ? shared->cq.get() : cq.get();
  if (uses_shared_receives() && slot_bytes() > shared->srq_slot_bytes) {
    throw Error(
        Errc::invalid_argument,
        fmt::format("this connection's max_message_bytes ({}) is larger than the shared receive queue's "
                    "buffers ({} bytes of payload): create the CompletionQueue with max_message_bytes ≥ {}",
                    options.max_message_bytes, shared->srq_slot_bytes - kFrameHeaderSize, options.max_message_bytes));
  }
  ibv_qp_init_attr attr{};
  attr.send_cq = completions;
  attr.recv_cq = completions;
  attr.srq = uses_shared_receives() ? shared->srq.get() : nullptr;
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 0;  // we choose per request which ones are signalled
  attr.cap.max_send_wr = options.send_queue_depth;
  attr.cap.max_recv_wr = uses_shared_receives() ? 0 : options.recv_queue_depth;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = options.max_inline;
  if (rdma_create_qp(id.get(), device.pd(), &attr) != 0) {
    throw_call_failed(
        Errc::system,
        fmt::format("rdma_create_qp({}, send {} / recv {} WRs, inline {}) — lower GRADLANE_SQ_DEPTH / "
                    "GRADLANE_RQ_DEPTH / GRADLANE_MAX_INLINE if the device limits them (max_qp_wr {})",
                    info.name, options.send_queue_depth, options.recv_queue_depth, options.max_inline, info.max_qp_wr),
        last_errno_or(EINVAL));
  }
  // Before anything can complete: the shared queue grows for this QP and routes its completions.
  if (shared) shared->attach(id->qp->qp_num, *this, cq_entries());
  // Providers may round the inline size up (rxe turns 0 into 16); never inline more than asked.
  options.max_inline = std::min(options.max_inline, attr.cap.max_inline_data);

  std::uint8_t timeout = options.ack_timeout;
  if (rdma_set_option(id.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof timeout) != 0) {
    throw_call_failed(Errc::system, fmt::format("rdma_set_option(ACK_TIMEOUT={})", timeout), errno);
  }

  // Control-message rings: registered once, copied through (control traffic, not gradients).
  const std::size_t slot = slot_bytes();
  const std::uint32_t send_slots = std::min<std::uint32_t>(32, options.send_queue_depth);
  send_ring_memory = Buffer::allocate(slot * send_slots, Buffer::Pages::small_only);
  send_ring = MemoryRegion::register_buffer(device, *send_ring_memory, Access::local);
  send_slot_op.assign(send_slots, 0);
  ops.assign(options.send_queue_depth, OpRecord{});
  if (uses_shared_receives()) return;  // the shared queue's buffers serve every connection on it
  recv_ring_memory = Buffer::allocate(slot * options.recv_queue_depth, Buffer::Pages::small_only);
  recv_ring = MemoryRegion::register_buffer(device, *recv_ring_memory, Access::local_write);
  for (std::uint32_t i = 0; i < options.recv_queue_depth; ++i) post_receive(i);
}

namespace {
// The IB spec's RNR timer codes (IBTA 9.7.5.2.8): the delay, in µs, a sender waits before it
// tries again after this side refused it for want of a posted receive.
constexpr std::array<std::uint32_t, 32> kRnrDelayMicros{
    655360, 10,   20,   30,   40,    60,    80,    120,   160,   240,   320,   480,    640,    960,    1280,   1920,
    2560,   3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
// 0.64 ms, as perftest and NCCL use. rdma_cm leaves code 0, the longest (655 ms): a burst that
// outran the receives (a shared receive queue run dry, a server busy applying) then stalls its
// sender 0.65 s per refusal, and under rxe the stall can outlast the ACK timeout and its
// retries and fail the connection (SharedReceiveQueue.Bursts… did, on a loaded CI machine).
constexpr std::uint8_t kRnrDelayCode = 12;
}  // namespace

void ConnectionState::shorten_receiver_not_ready_delay() {
  // RTS→RTS may change min_rnr_timer (IBTA 11.2.5: an optional attribute of that transition).
  // A device that refuses it keeps the long delay: slower under bursts, not broken, so the
  // connection goes on and says so.
  ibv_qp_attr attr{};
  attr.min_rnr_timer = kRnrDelayCode;
  if (const int rc = ibv_modify_qp(id->qp, &attr, IBV_QP_MIN_RNR_TIMER); rc != 0) {
    std::fprintf(
        stderr, "gradlane: %s; a sender this side refuses for want of a receive waits rdma_cm's default\n",
        call_failed(fmt::format("ibv_modify_qp(min_rnr_timer={}) on {}", kRnrDelayCode, device.info().name), rc)
            .c_str());
  }
}

ConnectionState::~ConnectionState() {
  revoke_windows();  // before the QP goes: a window bound on it holds it in the device
  // Completions still queued for this QP are dropped by the shared queue from now on.
  if (shared && id && id->qp) shared->detach(id->qp->qp_num, cq_entries());
  disconnect();
  if (cq && unacked_cq_events > 0) ibv_ack_cq_events(cq.get(), unacked_cq_events);  // ibv_destroy_cq waits for them
}

void ConnectionState::disconnect() noexcept {
  if (established && id) {
    // Tells the peer at once (it sees DISCONNECTED) instead of letting it time out.
    (void)rdma_disconnect(id.get());
    established = false;
  }
}

}  // namespace detail

std::chrono::microseconds Connection::receiver_not_ready_delay() const {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (const int rc = ibv_query_qp(state_->id->qp, &attr, IBV_QP_MIN_RNR_TIMER, &init); rc != 0) {
    detail::throw_call_failed(Errc::system, fmt::format("ibv_query_qp(min_rnr_timer) on {}", state_->description), rc);
  }
  return std::chrono::microseconds(detail::kRnrDelayMicros.at(attr.min_rnr_timer & 31u));
}

// ---- active side ----------------------------------------------------------------------------

namespace {

Connection connect_on(const Device& device, const std::string& address, std::uint16_t port,
                      const TransportOptions& options, std::shared_ptr<detail::SharedCq> shared) {
  using detail::CmPhase;
  auto state = detail::new_state(device, options);
  state->shared = std::move(shared);
  const Device& dev = state->device;
  const std::string peer = fmt::format("{}:{}", address, port);
  const auto timeout = options.connect_timeout;
  const auto deadline = detail::Clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - detail::Clock::now()));
  };

  rdma_cm_id* raw_id = nullptr;
  if (rdma_create_id(state->channel.get(), &raw_id, nullptr, RDMA_PS_TCP) != 0) {
    detail::throw_call_failed(Errc::system, "rdma_create_id", errno);
  }
  state->id.reset(raw_id);
  // Before the route is resolved: rdma_cm puts it in the route's traffic class, which the QP's
  // packets carry in their IP header.
  if (std::uint8_t tos = options.type_of_service; tos != 0) {
    if (rdma_set_option(state->id.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) != 0) {
      detail::throw_call_failed(Errc::system, fmt::format("rdma_set_option(TOS={})", tos), errno);
    }
  }

  sockaddr_in src = detail::make_address(detail::source_address_of(dev), 0, "source");
  sockaddr_in dst = detail::make_address(address, port, "destination");
  // Binding the source address matters when several devices share a host: without it rdma_cm
  // picks the device that owns the *destination* and the traffic never leaves that device.
  if (rdma_resolve_addr(state->id.get(), reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        static_cast<int>(left().count())) != 0) {
    detail::throw_call_failed(Errc::address_unresolved,
                              fmt::format("rdma_resolve_addr({} -> {})", dev.info().ipv4_address, peer), errno);
  }
  auto expect = [&](rdma_cm_event_type wanted, CmPhase phase) {
    auto event = detail::next_cm_event(state->channel.get(), left());
    if (!event) {
      throw Error(Errc::unreachable,
                  fmt::format("no answer from {} within {} ms while {}: the host is down or "
                              "the address is wrong (GRADLANE_CONNECT_TIMEOUT_MS)",
                              peer, timeout.count(), phase == CmPhase::connect ? "connecting" : "resolving"));
    }
    const auto refusal = event->type == RDMA_CM_EVENT_REJECTED ? detail::decode_refusal(event->private_data)
                                                               : std::optional<detail::Refusal>{};
    if (refusal == detail::Refusal::job_key) {
      throw Error(Errc::connection_rejected,
                  fmt::format("connection to {} refused by the listener: this side's job key (GRADLANE_JOB_KEY, "
                              "TransportOptions::job_key) is not the listener's — it serves another job, or the "
                              "keys were set differently",
                              peer));
    }
    if (refusal == detail::Refusal::busy) {
      throw Error(Errc::connection_rejected,
                  fmt::format("connection to {} refused by the listener: it is busy with as many connect handshakes "
                              "as it takes at once (its GRADLANE_MAX_PENDING_ACCEPTS); retry shortly",
                              peer));
    }
    if (event->type != wanted) throw detail::cm_event_error(event->type, event->status, phase, peer);
    return *event;
  };
  expect(RDMA_CM_EVENT_ADDR_RESOLVED, CmPhase::resolve_address);
  detail::require_device(state->id.get(), dev, dev.info().ipv4_address);
  if (rdma_resolve_route(state->id.get(), static_cast<int>(left().count())) != 0) {
    detail::throw_call_failed(Errc::route_unresolved, fmt::format("rdma_resolve_route({})", peer), errno);
  }
  expect(RDMA_CM_EVENT_ROUTE_RESOLVED, CmPhase::resolve_route);

  state->create_queue_pair();
  const auto handshake = detail::encode_handshake(state->options.job_key);
  rdma_conn_param param = detail::connection_parameters(dev, state->options, handshake);
  if (rdma_connect(state->id.get(), &param) != 0) {
    detail::throw_call_failed(Errc::unreachable, fmt::format("rdma_connect({})", peer), errno);
  }
  const auto established = expect(RDMA_CM_EVENT_ESTABLISHED, CmPhase::connect);
  state->established = true;  // from here, giving up disconnects: the listener is told
  state->shorten_receiver_not_ready_delay();
  // The listener answered with its own handshake: a listener of another job (or a stranger
  // that accepts anything) is not written to. The connection closes with `state`.
  try {
    detail::check_handshake(established.private_data);
  } catch (const Error& e) {
    throw Error(Errc::connection_rejected, fmt::format("{} accepted the connection but is not a gradlane listener of "
                                                       "this protocol: {}",
                                                       peer, e.what()));
  }
  if (!detail::same_job_key(established.private_data, state->options.job_key)) {
    throw Error(Errc::connection_rejected,
                fmt::format("{} accepted the connection with another job key than this side's (GRADLANE_JOB_KEY, "
                            "TransportOptions::job_key): it serves another job; nothing was sent to it",
                            peer));
  }
  detail::describe(*state);
  return detail::ConnectionAccess::make(std::move(state));
}

}  // namespace

namespace detail {

void require_same_device(const Device& device, const CompletionQueue& cq) {
  if (detail::CqAccess::state(cq)->device.context() != device.context()) {
    throw Error(Errc::invalid_argument,
                fmt::format("the completion queue belongs to {}, the connection to {}: a QP can only use a CQ of its "
                            "own device",
                            detail::CqAccess::state(cq)->device.info().name, device.info().name));
  }
}

}  // namespace detail

Connection connect(const Device& device, const std::string& address, std::uint16_t port,
                   const TransportOptions& options) {
  return connect_on(device, address, port, options, nullptr);
}

Connection connect(const Device& device, const std::string& address, std::uint16_t port,
                   const TransportOptions& options, const CompletionQueue& shared) {
  detail::require_same_device(device, shared);
  return connect_on(device, address, port, options, detail::CqAccess::state(shared));
}

}  // namespace gradlane
