#include "transport/ps/join.hpp"

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
  throw Error(Errc::protocol, fmt::format("the first message (kind {}) was not a hello", first.index() + 1));
}

std::vector<Joined> accept_hellos(Listener& listener, std::size_t count, const std::function<void(Connection&)>& advertise,
                                  Millis timeout, const char* who) {
  using Clock = std::chrono::steady_clock;
  // Short accept waits, so the hellos of connections already accepted are seen between them.
  constexpr Millis kAcceptSlice{20};
  std::vector<Joined> joined;
  std::vector<std::pair<Connection, std::size_t>> pending;  // accepted (in that order), no hello yet
  std::size_t accepted = 0;
  auto last_join = Clock::now();
  const auto drop = [&](const std::string& peer, const Error& e) {
    std::fprintf(stderr, "gradlane ps %s: dropped a connection before its hello (%s): %s\n", who, peer.c_str(), e.what());
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
        it = pending.erase(it);
        continue;
      }
      joined.push_back(Joined{std::move(it->first), *hello, it->second});
      it = pending.erase(it);
      last_join = Clock::now();
    }
    if (joined.size() < count && Clock::now() - last_join > timeout) {
      throw Error(Errc::timeout, fmt::format("{} of {} peers joined the {} on {}:{}; no other said hello within {} ms",
                                             joined.size(), count, who, listener.address(), listener.port(),
                                             timeout.count()));
    }
  }
  return joined;
}

}  // namespace gradlane::ps
