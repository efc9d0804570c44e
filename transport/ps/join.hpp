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

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "gradlane/connection.hpp"
#include "transport/ps/messages.hpp"

namespace gradlane::ps {

struct Joined {
  Connection conn;
  Hello hello;
  std::size_t accepted = 0;  // 0-based: the order its connection was accepted and advertised to
};

// The hello that opens an accepted connection: nullopt while nothing has arrived;
// Error(protocol) when the first message is not a hello.
std::optional<Hello> try_hello(Connection& conn);

// Accepts connections on `listener` until `count` peers have said hello; `advertise` is called
// on each accepted connection first (to send the region descriptors). A first message that is
// not a hello costs that connection only. Throws Error(timeout) when `timeout` passes without a
// new peer joining; `who` names the acceptor in messages ("server", "aggregator", ...).
std::vector<Joined> accept_hellos(Listener& listener, std::size_t count, const std::function<void(Connection&)>& advertise,
                                  Millis timeout, const char* who);

}  // namespace gradlane::ps
