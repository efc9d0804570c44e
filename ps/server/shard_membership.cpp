// Who a ShardServer (shard_server.cpp) serves: the workers (and the replica's primary) it
// accepts at start, the ones that join later (a restarted worker) and the probing of idle
// worker connections, so a peer gone without a word is found.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "ps/protocol/join.hpp"
#include "ps/server/shard_state.hpp"

namespace gradlane::ps {
using shard::Clock;
using shard::Peer;

void ShardServer::State::advertise(Connection& conn) {
  conn.advertise(kSlotRegionId, slots.region().descriptor());
  conn.advertise(kShardRegionId, shard.region().descriptor());
}

void ShardServer::accept_peers(std::size_t workers, Millis timeout) {
  State& s = *state_;
  const std::size_t expected = workers + (s.role == Role::replica ? 1 : 0);
  const auto advertise = [&](Connection& conn) { s.advertise(conn); };
  const char* who = s.role == Role::server ? "server" : "replica";
  for (std::size_t taken = 0; taken < expected;) {
    for (Joined& j : accept_hellos(s.listener, expected - taken, advertise, timeout, who)) {
      if (j.hello.kind == PeerKind::replica) {
        // Too early: it joins a running server (progress()). Its connection only is refused;
        // it fails there with a clear error and may try again.
        std::fprintf(stderr,
                     "gradlane ps %s: refused a replica joining before the start (%s): it joins a running "
                     "server\n",
                     who, j.conn.describe().c_str());
        continue;
      }
      if (j.hello.kind == PeerKind::primary) {
        if (s.role != Role::replica || s.primary)
          throw Error(Errc::protocol, "a second primary, or a primary at a server");
        s.primary_slots = j.conn.wait_region(kSlotRegionId, timeout);
        s.primary = s.peers.size();
      }
      s.peers.push_back(Peer{std::move(j.conn), j.hello.kind, j.hello.worker, true, {}, {}, {}, false, false});
      s.peers.back().addressed = j.hello.addressed;
      ++taken;
    }
  }
  s.start_admitting();
}

void ShardServer::State::start_admitting() {
  late.emplace(
      listener, [this](Connection& conn) { advertise(conn); }, options.transport.connect_timeout,
      role == Role::server ? "server" : "replica");
}

// Membership after the start: connections accepted from the poll loop (one non-blocking look
// every so many rounds: a restart is rare, a round is not), advertised to, and admitted when
// their hello comes. Each late connection's failure is its own; the job goes on.
std::size_t ShardServer::State::admit_joiners() {
  if (!late || rounds % 64 != 0) return 0;  // rounds: counted by progress()
  std::size_t work = 0;
  for (Joined& j : late->poll()) {
    ++work;
    try {
      if (j.hello.kind == PeerKind::replica) {
        adopt_replica(std::move(j.conn));
      } else if (j.hello.kind != PeerKind::worker) {
        throw Error(Errc::protocol, "a connection accepted after the start said hello as a primary, not a worker");
      } else {
        admit(std::move(j.conn), j.hello);
      }
    } catch (const Error& e) {
      late->refuse(j.conn, e);
    }
  }
  stats.joins_refused = late->refused();
  return work;
}

// A worker that connects under an id whose old connection still looks alive was restarted
// before its old connection failed here (a process killed and started again within the ACK
// timeout): the new connection supersedes the old one, which is written off as lost — its
// granted sequences become holes, skipped in order, exactly as if it had failed.
void ShardServer::State::admit(Connection&& conn, const Hello& hello) {
  for (Peer& old : peers) {
    if (old.alive && old.kind == PeerKind::worker && old.worker == hello.worker) {
      lose(old, Error(Errc::protocol, fmt::format("worker {} connected again ({}): this older connection is "
                                                  "superseded",
                                                  hello.worker, conn.describe())));
    }
  }
  peers.push_back(Peer{std::move(conn), PeerKind::worker, hello.worker, true, {}, {}, {}, false, false, true});
  peers.back().addressed = hello.addressed;
  ++stats.peers_joined;
  awaiting_rejoin.erase(hello.worker);
  following.mirrors_resumed(hello.worker);
  if (role == Role::server) {
    if (replica_at) tell_workers(*replica_at, 0, &peers.back());
    for (const auto& [aggregator, at] : aggregators_at) tell_workers(at, aggregator, &peers.back());
  }
  std::fprintf(stderr, "gradlane ps %s: worker %u joined the running job\n",
               role == Role::server ? "server" : "replica", hello.worker);
}

// A replica joining this running server (ShardServer::join_server): it gets a copy of the model
// at the version reached (taken here, between applies), and every decision after it. From now
// on grants wait for its acks, as for a replica from the start (slots it has not read are not
// reused; in sidecar mode what we report applied to the sidecar waits for them too). Refused,
// with the reason, where it cannot follow exactly.
void ShardServer::State::adopt_replica(Connection&& conn) {
  const auto refuse = [&](Errc code, const std::string& why) {
    throw Error(code, fmt::format("{}: a replica asked to join: {}", conn.describe(), why));
  };
  if (role != Role::server) refuse(Errc::protocol, "this is a replica (join its server)");
  if (stats.stepped_down) refuse(Errc::protocol, "this server stepped down");
  if (replica) refuse(Errc::protocol, "this server has a replica");
  const std::uint64_t version = writer.model_version();
  snapshot.emplace(device, shard.floats(), velocity);  // with momentum, its velocity too
  conn.advertise(kSnapshotRegionId, snapshot->region().descriptor());
  conn.send(encode(Adopted{version}));
  conn.send(encode(replica_key()));
  replica.emplace(std::move(conn));
  had_replica = stats.has_replica = true;  // cut_off(): losing every worker is a partition again
  stats.replica_acked = version;
  ++stats.replicas_joined;
  std::fprintf(stderr, "gradlane ps server: a replica joined at version %llu (%s)\n",
               static_cast<unsigned long long>(version), replica->describe().c_str());
}

// A server probes its idle workers (IdleProbe), and lose() skips their sequences; a replica its
// primary too, which it otherwise only hears from: a server that left while its disconnect was
// lost (the netem:0 fault: it stepped down and exited) would leave the replica waiting,
// unpromoted, forever.
void ShardServer::State::probe_idle_peers() {
  idle_probe.run(
      peers,
      [&](const Peer& peer) { return peer.kind == PeerKind::worker ? role == Role::server : role == Role::replica; },
      [&](Peer& peer, const Error& e) { lose(peer, e); });
}

}  // namespace gradlane::ps
