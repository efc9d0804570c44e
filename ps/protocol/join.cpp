#include "ps/protocol/join.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <optional>

namespace gradlane::ps {

std::optional<Hello> try_hello(Connection& conn) {
  const auto bytes = conn.try_receive();
  if (!bytes) return std::nullopt;
  const Message first = decode(*bytes);
  if (const auto* hello = std::get_if<Hello>(&first)) return *hello;
  if (std::holds_alternative<Bye>(first)) {
    // A ps::Worker checks the regions it was advertised and the shard's tensor before its
    // hello, and says bye when they do not fit it.
    throw Error(Errc::protocol,
                "it left before its hello: a worker does so when this shard's regions do not fit its model, or the "
                "shard holds another tensor (are worker and server configured with the same number of floats and "
                "tensor?); its own error says which");
  }
  throw Error(Errc::protocol, fmt::format("the first message (kind {}) was not a hello", first.index() + 1));
}

std::vector<Joined> accept_hellos(Listener& listener, std::size_t count,
                                  const std::function<void(Connection&)>& advertise, Millis timeout, const char* who,
                                  const DroppedBeforeHello& dropped) {
  using Clock = std::chrono::steady_clock;
  // Short accept waits, so the hellos of connections already accepted are seen between them.
  constexpr Millis kAcceptSlice{20};
  std::vector<Joined> joined;
  std::vector<std::pair<Connection, std::size_t>> pending;  // accepted (in that order), no hello yet
  std::size_t accepted = 0;
  auto last_join = Clock::now();
  const auto drop = [&](const std::string& peer, const Error& e) {
    std::fprintf(stderr, "gradlane ps %s: dropped a connection before its hello (%s): %s\n", who, peer.c_str(),
                 e.what());
  };
  while (joined.size() < count) {
    try {
      Connection conn = listener.accept(kAcceptSlice);
      const std::string peer = conn.describe();
      try {
        const std::size_t index = accepted++;
        advertise(conn);
        pending.emplace_back(std::move(conn), index);
      } catch (const Error& e) {
        drop(peer, e);
      }
    } catch (const Error& e) {
      if (e.code() != Errc::timeout) drop("during its connect", e);
    }
    for (auto it = pending.begin(); it != pending.end();) {
      std::optional<Hello> hello;
      try {
        hello = try_hello(it->first);
        if (!hello) {
          ++it;
          continue;
        }
      } catch (const Error& e) {
        drop(it->first.describe(), e);
        const std::size_t index = it->second;
        it = pending.erase(it);  // closed: nothing more of it lands
        if (dropped) dropped(index);
        continue;
      }
      joined.push_back(Joined{std::move(it->first), *hello, it->second});
      it = pending.erase(it);
      last_join = Clock::now();
    }
    if (joined.size() < count && Clock::now() - last_join > timeout) {
      throw Error(Errc::timeout,
                  fmt::format("{} of {} peers joined the {} on {}:{}; no other said hello within {} ms", joined.size(),
                              count, who, listener.address(), listener.port(), timeout.count()));
    }
  }
  return joined;
}

LateJoins::LateJoins(Listener& listener, std::function<void(Connection&)> advertise, Millis patience, const char* who,
                     DroppedBeforeHello dropped)
    : listener_(&listener),
      advertise_(std::move(advertise)),
      dropped_(std::move(dropped)),
      patience_(patience),
      who_(who) {}

void LateJoins::refuse(const Connection& conn, const Error& why) {
  ++refused_;
  std::fprintf(stderr, "gradlane ps %s: refused a late connection (%s): %s\n", who_, conn.describe().c_str(),
               why.what());
}

std::vector<Joined> LateJoins::poll() {
  std::vector<Joined> joined;
  if (admitting_) {
    try {
      while (auto conn = listener_->try_accept()) {
        try {
          // Numbered before advertise_ runs, as accept_hellos does: an advertise that fails
          // still used its number (an aggregator's partition), and the next must not reuse it.
          const std::size_t index = advertised_++;
          advertise_(*conn);
          pending_.push_back(Pending{std::move(*conn), std::chrono::steady_clock::now() + patience_, index});
        } catch (const Error& e) {
          refuse(*conn, e);
        }
      }
    } catch (const Error& e) {  // the listener's own failure: no more joins, the job goes on
      std::fprintf(stderr, "gradlane ps %s: stopped admitting peers: %s\n", who_, e.what());
      admitting_ = false;
    }
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    bool refused = false;
    try {
      const auto hello = try_hello(it->conn);
      if (!hello) {
        if (std::chrono::steady_clock::now() < it->deadline) {
          ++it;
          continue;
        }
        throw Error(Errc::timeout, fmt::format("no hello within {} ms", patience_.count()));
      }
      joined.push_back(Joined{std::move(it->conn), *hello, it->accepted});
    } catch (const Error& e) {
      refuse(it->conn, e);
      refused = true;
    }
    const std::size_t index = it->accepted;
    it = pending_.erase(it);  // a refused one is closed here: nothing more of it lands
    if (refused && dropped_) dropped_(index);
  }
  return joined;
}

}  // namespace gradlane::ps
