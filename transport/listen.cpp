// The passive side of connection setup over librdmacm: listen → connect request → accept, the
// handshake of every accepted peer awaited on the listener's one event channel with a deadline.
#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
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

// A peer whose connect request we accepted, waiting for its handshake to complete (its RTU).
// Its id stays on the listener's channel until then, so one wait sees every peer's progress.
struct PendingPeer {
  std::unique_ptr<ConnectionState> state;
  std::string peer;
  Clock::time_point deadline;  // connect_timeout after its request: then it is dropped
};

class ListenerState {
 public:
  explicit ListenerState(const Device& dev) : device(dev) {}
  Device device;
  TransportOptions options;
  ChannelPtr channel;
  IdPtr id;
  std::string address;
  std::uint16_t port = 0;
  std::string here;                  // "address:port", for errors: formatted once, not on every try_accept()
  std::shared_ptr<SharedCq> shared;  // completion queue for the connections accepted, or null
  // Declared after `channel`/`id`: destroyed first (their ids live on the listener's channel).
  std::vector<PendingPeer> pending;
};

}  // namespace detail

Listener::Listener(const Device& device, std::uint16_t port, const TransportOptions& options,
                   const std::string& address)
    : state_(std::make_unique<detail::ListenerState>(device)) {
  options.validate();
  auto& s = *state_;
  s.options = options;
  s.channel = detail::make_channel();
  rdma_cm_id* raw_id = nullptr;
  if (rdma_create_id(s.channel.get(), &raw_id, nullptr, RDMA_PS_TCP) != 0) {
    detail::throw_call_failed(Errc::system, "rdma_create_id", errno);
  }
  s.id.reset(raw_id);
  s.address = address.empty() ? detail::source_address_of(s.device) : address;
  sockaddr_in addr = detail::make_address(s.address, port, "listen");
  if (rdma_bind_addr(s.id.get(), reinterpret_cast<sockaddr*>(&addr)) != 0) {
    const int err = errno;
    // Not call_failed(): "rdma_bind_addr(...) — the port is taken failed: ..." read backwards.
    throw Error(err == EADDRINUSE ? Errc::invalid_argument : Errc::address_unresolved,
                fmt::format("cannot listen on {}:{}: {} (rdma_bind_addr, errno {}) — {}", s.address, port,
                            std::strerror(err), err,
                            err == EADDRINUSE
                                ? "another process (an earlier run?) holds this port: stop it or choose another port"
                                : "is the address assigned to an RDMA interface?"),
                err);
  }
  detail::require_device(s.id.get(), s.device, s.address);
  if (rdma_listen(s.id.get(), 64) != 0) {
    detail::throw_call_failed(Errc::system, fmt::format("rdma_listen({}:{})", s.address, port), errno);
  }
  s.port = ntohs(rdma_get_src_port(s.id.get()));
  s.here = fmt::format("{}:{}", s.address, s.port);
}

Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;
std::uint16_t Listener::port() const { return state_->port; }
void Listener::use_completion_queue(const CompletionQueue& cq) {
  detail::require_same_device(state_->device, cq);
  state_->shared = detail::CqAccess::state(cq);
}
const std::string& Listener::address() const { return state_->address; }

namespace {

void drop_peer(const std::string& here, const std::string& peer, const std::string& why) {
  std::fprintf(stderr, "gradlane: dropped connection attempt from %s on %s: %s\n", peer.c_str(), here.c_str(),
               why.c_str());
}

// EINVAL from rdma_create_qp or rdma_accept on an incoming request, with queue depths the
// device allows, is the kernel's answer once the peer abandoned the request (its rdma_cm id
// left REQ_RCVD): it waited here past the peer's connect timeout. Seen with 32 workers
// connecting at once; the generic text blamed the queue depths, which were fine.
bool abandoned(const detail::ListenerState& s, const Error& e) {
  const std::uint32_t most = s.device.info().max_qp_wr;
  return e.sys_errno() == EINVAL && s.options.send_queue_depth <= most && s.options.recv_queue_depth <= most;
}
constexpr const char* abandoned_text =
    "the peer gave up on its connect request before this listener answered it (EINVAL from rdma_create_qp / "
    "rdma_accept: the request waited past the peer's connect timeout — a burst of requests, or a listener that "
    "accepts late); the peer retries or reports its own timeout";

// Accepts a connect request: QP, rings, rdma_accept. The handshake completes later (pending).
std::optional<detail::PendingPeer> answer_request(detail::ListenerState& s, const detail::CmEvent& event,
                                                  const std::string& here) {
  auto state = std::make_unique<detail::ConnectionState>(s.device, s.options);
  state->shared = s.shared;
  state->id.reset(event.id);
  const std::string peer = detail::address_text(rdma_get_peer_addr(event.id));
  try {
    detail::check_handshake(event.private_data);
  } catch (const Error& e) {
    // A stranger or an incompatible peer: refuse it and keep listening.
    std::fprintf(stderr, "gradlane: refused connection from %s on %s: %s\n", peer.c_str(), here.c_str(), e.what());
    (void)rdma_reject(state->id.get(), nullptr, 0);
    return std::nullopt;
  }
  if (!detail::same_job_key(event.private_data, s.options.job_key)) {
    // Another job's process, or one that guessed: it gets no QP. The refusal says why.
    std::fprintf(stderr,
                 "gradlane: refused connection from %s on %s: its job key differs from this listener's "
                 "(GRADLANE_JOB_KEY): not a member of this job\n",
                 peer.c_str(), here.c_str());
    const auto refusal = detail::encode_refusal(detail::Refusal::job_key);
    (void)rdma_reject(state->id.get(), refusal.data(), static_cast<std::uint8_t>(refusal.size()));
    return std::nullopt;
  }
  if (s.pending.size() >= s.options.max_pending_accepts) {
    // Each answered request holds a QP and registered rings until its handshake completes.
    std::fprintf(stderr,
                 "gradlane: refused connection from %s on %s: %zu connect handshakes are in progress, the most it "
                 "takes at once (GRADLANE_MAX_PENDING_ACCEPTS)\n",
                 peer.c_str(), here.c_str(), s.pending.size());
    const auto refusal = detail::encode_refusal(detail::Refusal::busy);
    (void)rdma_reject(state->id.get(), refusal.data(), static_cast<std::uint8_t>(refusal.size()));
    return std::nullopt;
  }
  try {
    state->create_queue_pair();
    const auto handshake = detail::encode_handshake(s.options.job_key);
    rdma_conn_param param = detail::connection_parameters(s.device, state->options, handshake);
    if (rdma_accept(state->id.get(), &param) != 0) {
      detail::throw_call_failed(Errc::system, fmt::format("rdma_accept({})", peer), errno);
    }
    state->shorten_receiver_not_ready_delay();  // rdma_accept took the QP to RTS
  } catch (const Error& e) {
    // This peer's failure is its own: the listener keeps serving the others.
    drop_peer(here, peer, abandoned(s, e) ? abandoned_text : e.what());
    return std::nullopt;
  }
  return detail::PendingPeer{std::move(state), peer, detail::Clock::now() + s.options.connect_timeout};
}

}  // namespace

namespace {

// Drops the peers whose handshake outlived connect_timeout.
void expire_pending(detail::ListenerState& s, const std::string& here, detail::Clock::time_point now) {
  std::erase_if(s.pending, [&](const detail::PendingPeer& p) {
    if (p.deadline > now) return false;
    drop_peer(here, p.peer,
              fmt::format("it did not complete the handshake within {} ms (GRADLANE_CONNECT_TIMEOUT_MS)",
                          s.options.connect_timeout.count()));
    return true;
  });
}

// One listener event: a connect request is answered (its handshake pending), a handshake that
// completed gives its connection, a failed one drops its peer.
std::optional<Connection> take_event(detail::ListenerState& s, const detail::CmEvent& event, const std::string& here) {
  if (event.type == RDMA_CM_EVENT_CONNECT_REQUEST) {
    if (auto pending = answer_request(s, event, here)) s.pending.push_back(std::move(*pending));
    return std::nullopt;
  }
  const auto it = std::find_if(s.pending.begin(), s.pending.end(),
                               [&](const detail::PendingPeer& p) { return p.state->id.get() == event.id; });
  if (it == s.pending.end()) return std::nullopt;  // e.g. a late event of an id already dropped
  detail::PendingPeer peer = std::move(*it);
  s.pending.erase(it);
  if (event.type != RDMA_CM_EVENT_ESTABLISHED) {
    drop_peer(here, peer.peer,
              detail::cm_event_error(event.type, event.status, detail::CmPhase::accept, peer.peer).what());
    return std::nullopt;
  }
  auto& state = *peer.state;
  // Each connection gets its own event channel so it sees only its own events.
  state.channel = detail::make_channel();
  if (rdma_migrate_id(state.id.get(), state.channel.get()) != 0) {
    detail::throw_call_failed(Errc::system, "rdma_migrate_id", errno);
  }
  state.established = true;
  detail::describe(state);
  return detail::ConnectionAccess::make(std::move(peer.state));
}

}  // namespace

Connection Listener::accept(Millis timeout) {
  // Every peer's handshake is bounded by connect_timeout and the whole call by `timeout`; a
  // peer that sends a request and never completes the handshake (half-open) costs only
  // itself: the others are accepted meanwhile, and it is dropped when its time is up.
  auto& s = *state_;
  const auto deadline = detail::Clock::now() + timeout;
  const std::string& here = s.here;
  for (;;) {
    // Events already queued come first: a handshake whose ESTABLISHED waits in the channel
    // completed, however late this caller reads it. Expiring before looking dropped such
    // peers when a burst of connect requests (32 workers at once, each answer a QP and its
    // rings) or a caller busy between accepts kept the channel unread past connect_timeout.
    auto event = detail::next_cm_event(s.channel.get(), std::chrono::milliseconds(0));
    const auto now = detail::Clock::now();
    if (!event) {
      expire_pending(s, here, now);
      auto until = deadline;
      for (const auto& p : s.pending) until = std::min(until, p.deadline);
      const auto wait =
          std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(until - now));
      // A zero wait would be a single non-blocking look: wait at least 1 ms while time is left.
      event = detail::next_cm_event(s.channel.get(), wait.count() > 0 ? wait : std::chrono::milliseconds(1));
    }
    if (!event) {
      if (detail::Clock::now() < deadline) continue;  // a pending peer's time ran out: drop it
      throw Error(Errc::timeout,
                  fmt::format("no peer connected to {} within {} ms{}", here, timeout.count(),
                              s.pending.empty() ? ""
                                                : fmt::format(" ({} connect request(s) still in their handshake)",
                                                              s.pending.size())));
    }
    if (auto conn = take_event(s, *event, here)) return std::move(*conn);
  }
}

std::optional<Connection> Listener::try_accept() {
  auto& s = *state_;
  const std::string& here = s.here;  // a poll loop calls this: no allocation per call
  while (auto event = detail::next_cm_event(s.channel.get(), std::chrono::milliseconds(0))) {
    if (auto conn = take_event(s, *event, here)) return conn;
  }
  if (!s.pending.empty()) expire_pending(s, here, detail::Clock::now());
  return std::nullopt;
}

}  // namespace gradlane
