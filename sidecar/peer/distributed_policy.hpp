// DistributedPolicy: the scheduling policy of a gradlaned that has peers on other hosts.
//
// Each sidecar runs one scheduling core for the receivers (servers) it hosts: it owns their
// ingress timelines and decides, for every request addressed to them — local or forwarded by a
// peer — when it may go (receiver-driven slot agreement, messages.hpp). A request from a local
// application to a receiver on another host is forwarded to that host's sidecar, and its
// answers come back as Grant/Redirect/Drop outcomes on this host's clock. The sender side owns
// its egress: a granted slot is booked on the sending NIC's own SlotBook, and if it collides
// with a slot another receiver granted, it is moved to after it (the receiver learns the real
// timing from TransferDone, which feeds its bandwidth estimate).
//
// Ownership: exactly one sidecar hands out a receiver's sequence numbers — the one that lists
// it among its endpoints. A request for a receiver this sidecar does not own goes to the peer
// that announced it (Hello); if no sidecar announced it, it is refused (unknown_receiver),
// except by a sidecar with no endpoints of its own, which schedules everything itself (the
// permissive single-daemon mode).
//
// Failure: a peer whose link fails is forgotten. Requests forwarded to it are answered with
// Drop{peer_lost} for every part it had not decided (the application hears, nothing hangs);
// later requests for its receivers are refused (receiver_unreachable), never scheduled here:
// the lost peer may still be alive and granting, and two owners would hand out the same
// sequence number twice. Transfers this sidecar granted to it are completed as failed so
// credit and sequence space are released (their slots stay held: see sched::used_slot).
//
// Rejoining: a peer sidecar that restarts connects again and gets a new link (take_joined);
// we send it our Hello, and its Hello gives it back the endpoints its lost link announced —
// never endpoints a live peer serves.
//
// Failover: ownership moves only by a Takeover, sent by the sidecar of the host where a
// receiver's replica was promoted (take_over()). The old owner stops scheduling the receiver
// and drops its pending parts with receiver_moved (a new request reaches the new owner); a
// request that still reaches it is answered with that drop. The new owner starts the sequence
// where the promoted replica says it may.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sidecar/core/policy.hpp"
#include "sidecar/core/scheduler.hpp"
#include "sidecar/peer/forwarded_requests.hpp"
#include "sidecar/peer/messages.hpp"
#include "sidecar/peer/peer_transport.hpp"
#include "sidecar/peer/remote_requests.hpp"

namespace gradlane::peer {

struct DistributedStats {
  std::uint64_t forwarded = 0;        // local requests sent to a peer's sidecar
  std::uint64_t remote_requests = 0;  // requests peers forwarded to us
  std::uint64_t answers_sent = 0;
  std::uint64_t answers_received = 0;
  std::uint64_t egress_moves = 0;     // granted slots moved because our egress was busy
  std::uint64_t protocol_errors = 0;  // malformed or unexpected peer messages (dropped)
  std::uint64_t peers_lost = 0;
  std::uint64_t remote_refused = 0;  // peer requests dropped: too many (or too many bytes) pending here, or too large
  std::uint64_t takeovers_refused = 0;  // peers' takeovers not taken: a stale epoch, another job, our server alive
  std::uint64_t takeovers_held = 0;     // takeovers that arrived while our server was alive, held for its exit
};

// How long a takeover that arrived while the receiver's server here still lived is held for
// that server's exit. A killed server's connections can close (and its replica be promoted)
// before its exit shows here, most of all on a loaded host; a server alive past this is a
// replica promoted while its server lives, and the sequence stays with the server.
inline constexpr sched::Nanos kTakeoverHold{10'000'000'000};

class DistributedPolicy final : public sched::Policy {
 public:
  using Log = std::function<void(const std::string&)>;
  // Sees every decision: origin "here" (this sidecar's scheduler decided it, for a local or a
  // remote application) or "peer" (a peer's answer for one of our applications).
  using DecisionHook = std::function<void(const sched::Outcome&, sched::Instant, std::string_view origin)>;
  // Sees every completion of a transfer this sidecar's scheduler granted (local, reported by a
  // peer, or failed because its app or peer is gone), with the transfer as it was granted.
  using CompletionHook = std::function<void(sched::TransferId, const sched::TransferView&, sched::Instant now,
                                            sched::Nanos measured, sched::TransferResult)>;
  // Sees every request of this host's applications it accepted, when it was submitted.
  using RequestHook = std::function<void(const sched::Request&, sched::Instant now)>;
  // Sees every acknowledgement of a receiver on this host: its server applied (and its replica
  // holds) every sequence through `through`.
  using AppliedHook = std::function<void(sched::EndpointId receiver, sched::Seq through)>;

  // `local_endpoints`: the NICs (scheduler endpoint ids) of this host.
  DistributedPolicy(sched::SchedulerConfig config, std::vector<std::uint32_t> local_endpoints, PeerTransport& transport,
                    Log log = {});

  void on_decision(DecisionHook hook) { decision_hook_ = std::move(hook); }
  void on_completion(CompletionHook hook) { completion_hook_ = std::move(hook); }
  void on_request(RequestHook hook) { request_hook_ = std::move(hook); }
  void on_applied(AppliedHook hook) { applied_hook_ = std::move(hook); }
  // Without it, a receiver whose server attached here counts as alive until serve_job(nullopt).
  void check_servers_with(ServerAlive alive) override { server_alive_ = std::move(alive); }

  // Announces our endpoints to every peer. Call once the links are up.
  void start();
  // True once every peer has said Hello (until then its receivers are unknown_receiver).
  bool ready() const;

  sched::SubmitStatus submit(const sched::Request& request, sched::Instant now) override;
  void schedule(sched::Instant now, std::vector<sched::Outcome>& out) override;
  bool complete(sched::TransferId transfer, sched::Instant now, sched::Nanos measured,
                sched::TransferResult result) override;
  // Only for a receiver on this host: its sidecar owns the sequence.
  bool replica_ack(sched::EndpointId receiver, sched::Seq seq) override {
    if (!schedules_here(receiver) || !scheduler_.replica_ack(receiver, seq)) return false;
    if (applied_hook_) applied_hook_(receiver, seq);
    return true;
  }
  std::optional<sched::Instant> next_wakeup() const override;
  // Failover: the replica of `receiver` on this host, an app of `job`, was promoted at
  // `version`. This sidecar owns the receiver's sequence from now on and tells every peer
  // (Takeover, at the next epoch); the old owner drops what it had pending for it
  // (receiver_moved). If this sidecar owned it already (the replica on the server's host), its
  // own pending parts are dropped and the sequence restarts.
  bool take_over(sched::EndpointId receiver, sched::Version version, sched::JobId job, sched::Instant now) override;
  // Only where this sidecar hands the receiver's sequence out does the limit act; kept anyway.
  void limit_window(sched::EndpointId receiver, std::uint64_t slots) override {
    scheduler_.limit_window(receiver, slots);
  }
  void hold_receiver(sched::EndpointId receiver) override { scheduler_.hold_receiver(receiver); }
  // With the server's grant key, the grants answered to peers for the receiver carry tokens.
  // A server that left (job nullopt) leaves its key: its sequence goes on (Daemon::grant_keys_).
  void serve_job(sched::EndpointId receiver, std::optional<sched::JobId> job,
                 std::optional<sched::GrantKey> key = std::nullopt) override {
    scheduler_.serve_job(receiver, job);
    if (!job) return;
    if (key) {
      grant_keys_[sched::to_int(receiver)] = *key;
    } else {
      grant_keys_.erase(sched::to_int(receiver));
    }
  }
  bool hands_out(sched::EndpointId receiver) const override { return schedules_here(receiver); }
  // Requests past `limit` pending from one peer are answered with a drop (tests set it low).
  void limit_pending_per_peer(std::size_t limit) { remote_.limit_requests(limit); }
  // Bytes: one request at most `request`, a peer's pending ones together at most `pending`
  // (gradlaned sets them from --max-update-bytes and --max-apps x --max-owed-bytes).
  void limit_peer_bytes(std::uint64_t request, std::uint64_t pending) { remote_.limit_bytes(request, pending); }

  const DistributedStats& stats() const noexcept { return stats_; }
  sched::Scheduler& scheduler() noexcept { return scheduler_; }

 private:
  // The request to this sidecar's scheduler, or forwarded to the receiver's sidecar.
  sched::SubmitStatus submit_here_or_forward(const sched::Request& request, sched::Instant now);

  struct ProxyTransfer {  // a transfer a peer granted to one of our applications
    PeerIndex peer = 0;
    std::uint64_t their_transfer = 0;
  };

  void pump(sched::Instant now, std::vector<sched::Outcome>& out);
  void on_message(PeerIndex peer, const Message& message, sched::Instant now, std::vector<sched::Outcome>& out);
  void on_answer(PeerIndex peer, const SlotAnswer& answer, sched::Instant now, std::vector<sched::Outcome>& out);
  void on_takeover(PeerIndex peer, const Takeover& m, sched::Instant now);
  struct TakeoverRefusal {
    std::string why;
    bool server_alive = false;  // only the server's life stands in the way: held for its exit
  };
  // Why a peer's takeover must not be taken (now), or nullopt.
  std::optional<TakeoverRefusal> refuse_takeover(const Takeover& m) const;
  void take_peer_takeover(PeerIndex peer, const Takeover& m);
  void refuse_peer_takeover(PeerIndex peer, const Takeover& m, std::string_view why);  // counted and logged
  // Takes the held takeovers whose server has exited since; refuses those held past kTakeoverHold.
  void settle_held_takeovers(sched::Instant now);
  Hello hello() const;
  void learn(const TakeoverMark& mark);
  void answer_remote(const sched::Outcome& outcome, sched::Instant now);
  void lose_peer(PeerIndex peer, sched::Instant now, std::vector<sched::Outcome>& out);
  void admit_joined();
  // scheduler_.complete() plus the completion hook: every completion goes through here.
  bool finish(sched::TransferId transfer, sched::Instant now, sched::Nanos measured, sched::TransferResult result);
  bool send(PeerIndex peer, const Message& message);
  std::optional<PeerIndex> owner_of(sched::EndpointId endpoint) const;
  bool is_local(sched::EndpointId endpoint) const { return local_.contains(sched::to_int(endpoint)); }
  // Whether this sidecar hands `endpoint`'s sequence out: one of its own endpoints, or — a
  // sidecar without endpoints of its own being the only scheduler there is — one that no peer
  // announced. Requests and a server's acks go by the same rule (an ack refused where the
  // request was taken would stall a sidecar-mode server after `slots` grants, e.g. at a
  // gradlaned started without --endpoint).
  bool schedules_here(sched::EndpointId endpoint) const {
    return is_local(endpoint) || (local_.empty() && !endpoint_owner_.contains(sched::to_int(endpoint)));
  }
  sched::Slot book_egress(sched::EndpointId sender, sched::Slot slot);
  void note(const std::string& line) const {
    if (log_) log_(line);
  }

  sched::Scheduler scheduler_;
  std::set<std::uint32_t> local_;
  PeerTransport& transport_;
  Log log_;
  DecisionHook decision_hook_;
  CompletionHook completion_hook_;
  RequestHook request_hook_;
  AppliedHook applied_hook_;
  std::map<std::uint32_t, PeerIndex> endpoint_owner_;  // remote endpoint -> its sidecar
  std::map<std::uint32_t, TakeoverMark> takeovers_;    // endpoint -> its latest takeover we know of
  struct HeldTakeover {
    PeerIndex peer = 0;
    Takeover takeover;
    sched::Instant until{};
  };
  std::map<std::uint32_t, HeldTakeover> held_takeovers_;  // local endpoint -> the latest one held
  ServerAlive server_alive_;
  std::set<PeerIndex> greeted_;
  std::set<PeerIndex> lost_;
  ForwardedRequests forwarded_;                                   // our apps' requests a peer schedules
  RemoteRequests remote_;                                         // peers' requests in our scheduler
  std::unordered_map<std::uint64_t, PeerIndex> granted_to_peer_;  // our TransferId -> peer
  std::unordered_map<std::uint64_t, ProxyTransfer> proxies_;      // proxy TransferId -> peer's
  std::map<std::uint32_t, sched::SlotBook> egress_;               // our NICs' egress
  std::map<std::uint32_t, sched::GrantKey> grant_keys_;           // local receiver -> its server's key
  std::uint64_t token_for(sched::EndpointId receiver, sched::Seq seq) const;
  std::vector<sched::Outcome> decided_;  // reused buffer
  std::vector<sched::Outcome> moved_;    // close_receiver()'s drops, routed by the next schedule()
  std::uint64_t next_proxy_ = 1;
  std::uint64_t next_remote_ = 1;
  sched::Instant last_now_{};
  DistributedStats stats_;
};

}  // namespace gradlane::peer
