// Joining a shard role: how a server, a replica and an aggregator take their peers in.
//
// A peer connects, is sent the acceptor's region descriptors, and says hello (who it is). Under
// load a peer's connect attempt can time out on its side and be retried (connect_with_retry),
// leaving the acceptor a half-open connection that fails on first use or never speaks. Taking
// peers one at a time, such a connection would hold the acceptor until its timeout while the
// real peers' own waits for the descriptors expire — one slow connect failing a whole run. So
// hellos are awaited on all accepted connections at once, and one that fails before its hello
// is dropped with a line on stderr.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "gradlane/connection.hpp"
#include "ps/protocol/messages.hpp"

namespace gradlane::ps {

struct Joined {
  Connection conn;
  Hello hello;
  std::size_t accepted = 0;  // 0-based: the order its connection was accepted and advertised to
};

// The hello that opens an accepted connection: nullopt while nothing has arrived;
// Error(protocol) when the first message is not a hello.
std::optional<Hello> try_hello(Connection& conn);

// What an acceptor gives back when a connection it advertised to is dropped before its hello
// (called once that connection is closed): its number, as Joined::accepted counts.
using DroppedBeforeHello = std::function<void(std::size_t accepted)>;

// Accepts connections on `listener` until `count` peers have said hello; `advertise` is called
// on each accepted connection first (to send the region descriptors). A first message that is
// not a hello costs that connection only (and `dropped` hears of it). Throws Error(timeout) when
// `timeout` passes without a new peer joining; `who` names the acceptor in messages ("server",
// "aggregator", ...).
std::vector<Joined> accept_hellos(Listener& listener, std::size_t count,
                                  const std::function<void(Connection&)>& advertise, Millis timeout, const char* who,
                                  const DroppedBeforeHello& dropped = {});

// Peers that join after the start (a restarted worker, a replica joining, workers coming back
// to a restarted aggregator), taken from an acceptor's poll loop without waiting: each call
// accepts what is queued, advertises to it, and hands out the connections whose hello came.
// One that says nothing within `patience`, or whose first message is not a hello, is refused
// (counted, with a line on stderr); a failing listener ends admission, the job goes on.
// Joined::accepted numbers the connections in the order they were advertised to, from 0 at
// this LateJoins' start.
class LateJoins {
 public:
  LateJoins(Listener& listener, std::function<void(Connection&)> advertise, Millis patience, const char* who,
            DroppedBeforeHello dropped = {});
  std::vector<Joined> poll();
  std::uint64_t refused() const { return refused_; }
  // Counts a joiner the caller refused after its hello, with the reason on stderr.
  void refuse(const Connection& conn, const Error& why);

 private:
  struct Pending {
    Connection conn;
    std::chrono::steady_clock::time_point deadline;
    std::size_t accepted = 0;
  };
  Listener* listener_;
  std::function<void(Connection&)> advertise_;
  DroppedBeforeHello dropped_;
  Millis patience_;
  const char* who_;
  bool admitting_ = true;
  std::vector<Pending> pending_;
  std::size_t advertised_ = 0;  // connections advertised to: Joined::accepted, 0-based
  std::uint64_t refused_ = 0;
};

// A peer connection the acceptor only answers goes silent when the peer's host or link dies
// without a disconnect (the CM's disconnect request lost with the link): nothing would ever fail
// it, and the acceptor would wait for that peer for good. So, once a second, every idle
// connection its owner chooses gets a zero-length probe; a dead peer fails it within the
// transport's ACK timeout and retries (~2 s).
class IdleProbe {
 public:
  // Probes each peer of `peers` (each with `alive` and `conn`) that is alive, idle and
  // `chosen`, at most once a second; `lose` hears of each probe that failed. Returns how many
  // failed. A clock read costs ~1 µs under some VMs: one every 256 calls.
  template <typename Peers, typename Chosen, typename Lose>
  std::size_t run(Peers& peers, Chosen chosen, Lose lose) {
    if (++calls_ % 256 != 0) return 0;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::seconds(1)) return 0;
    last_ = now;
    std::size_t failed = 0;
    for (auto& peer : peers) {
      if (!peer.alive || !chosen(peer) || peer.conn.outstanding() != 0) continue;
      try {
        peer.conn.probe();
      } catch (const Error& e) {
        lose(peer, e);
        ++failed;
      }
    }
    return failed;
  }

 private:
  std::uint32_t calls_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace gradlane::ps
