#include "transport/ps/join.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <optional>

namespace gradlane::ps {

std::vector<Joined> accept_hellos(Listener& listener, std::size_t count, const std::function<void(Connection&)>& advertise,
                                  Millis timeout, const char* who) {
  using Clock = std::chrono::steady_clock;
  // Short accept waits, so the hellos of connections already accepted are seen between them.
  constexpr Millis kAcceptSlice{20};
  std::vector<Joined> joined;
  std::vector<Connection> pending;  // accepted, no hello yet
  auto last_join = Clock::now();
  const auto drop = [&](const std::string& peer, const Error& e) {
    std::fprintf(stderr, "gradlane ps %s: dropped a connection before its hello (%s): %s\n", who, peer.c_str(), e.what());
  };
  while (joined.size() < count) {
    try {
      Connection conn = listener.accept(kAcceptSlice);
      const std::string peer = conn.describe();
      try {
        advertise(conn);
        pending.push_back(std::move(conn));
      } catch (const Error& e) {
        drop(peer, e);
      }
    } catch (const Error& e) {
      if (e.code() != Errc::timeout) drop("during its connect", e);
    }
    for (auto it = pending.begin(); it != pending.end();) {
      std::optional<Hello> hello;
      try {
        const auto bytes = it->try_receive();
        if (!bytes) {
          ++it;
          continue;
        }
        const Message first = decode(*bytes);
        if (const auto* h = std::get_if<Hello>(&first)) hello = *h;
        if (!hello) throw Error(Errc::protocol, fmt::format("the first message (kind {}) was not a hello", first.index() + 1));
      } catch (const Error& e) {
        drop(it->describe(), e);
        it = pending.erase(it);
        continue;
      }
      joined.push_back(Joined{std::move(*it), *hello});
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
