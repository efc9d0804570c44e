// Aggregator: sums groups of workers' updates and forwards each sum to the shard server (and
// its replica) as one update (protocol: include/gradlane/ps.hpp, "Aggregation"). What both
// modes share is here: the member connections, the forward (towards the shard it is one
// ps::Worker: a group is summed straight into that worker's registered gradient buffer, the
// kernel writes it and nothing is copied), and the public API; the modes are DirectMembers and
// SidecarMembers.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "gradlane/ps/aggregator.hpp"
#include "ps/aggregator/aggregator_state.hpp"
#include "ps/protocol/join.hpp"

namespace gradlane::ps {
namespace {

using Clock = std::chrono::steady_clock;

std::uint32_t ring_slots(const AggregatorOptions& o) {
  if (o.slots != 0) return o.slots;
  return o.sidecar ? 16 : 2 * o.group;  // sidecar mode: per worker (aggregate id % slots)
}

WorkerOptions forward_options(const AggregatorOptions& o) {
  WorkerOptions w;
  w.id = o.id;
  w.server = o.server;
  w.replica = o.replica;
  w.floats = o.floats;
  w.tensor = o.tensor;
  w.timeout = o.timeout;
  w.transport = o.transport;
  return w;
}

}  // namespace

Aggregator::State::State(const Device& dev, std::uint16_t port, const AggregatorOptions& o)
    : device(dev), options(o), listener(dev, port, o.transport), forward(dev, forward_options(o)) {
  if (o.sidecar) {
    sidecar.emplace(o, ring_slots(o));
  } else {
    direct.emplace(dev, o, ring_slots(o));
  }
}

void Aggregator::State::lose(MemberPeer& peer, const Error& why) {
  if (!peer.alive) return;
  peer.alive = false;
  peer.conn.close();  // a peer written off here is told (see ShardServer::State::lose)
  const bool owes = direct && direct->owes(peers, peer);
  if (left_cleanly(peer.said_bye, owes)) {
    ++stats.peers_left;
    return;
  }
  ++stats.peers_lost;
  std::fprintf(stderr, "gradlane ps aggregator: lost worker %u%s: %s\n", peer.worker, lost_note(owes), why.what());
  if (direct) direct->forget(peer);  // its granted members will never be written
}

std::size_t Aggregator::State::probe_idle_members() {
  return idle_probe.run(
      peers, [](const MemberPeer&) { return true; }, [&](MemberPeer& peer, const Error& e) { lose(peer, e); });
}

template <typename Push>
PushResult Aggregator::State::rejoining_if_out_of_reach(Push&& push) {
  try {
    return push();
  } catch (const Error& e) {
    if (options.rejoin_within.count() == 0 || !out_of_reach(e)) throw;
    rejoin_forward(e);
    PushResult lost;
    lost.lost = true;
    return lost;
  }
}

PushResult Aggregator::State::push_forward(std::uint64_t computed_on, std::uint64_t tag) {
  return rejoining_if_out_of_reach([&] { return forward.push(computed_on, tag); });
}

PushResult Aggregator::State::write_forward(std::uint64_t sequence, std::uint64_t token) {
  return rejoining_if_out_of_reach([&] { return forward.write_as(sequence, token); });
}

// The forward lost the server and the replica (a link down): a new connection to the running
// job, as a worker rejoins (the server admits it as a late joiner and supersedes the old one),
// retried until rejoin_within; its sums go on from a new registered buffer.
void Aggregator::State::rejoin_forward(const Error& why) {
  const auto lost_at = Clock::now();
  const auto deadline = lost_at + options.rejoin_within;
  std::fprintf(stderr, "gradlane ps aggregator: lost its server (%s); rejoining the job for up to %lld ms\n",
               why.what(), static_cast<long long>(options.rejoin_within.count()));
  for (;;) {
    WorkerOptions w = forward_options(options);
    w.connect_within = std::max(std::chrono::ceil<Millis>(deadline - Clock::now()), Millis(1));
    try {
      forward = Worker(device, w);
      forward.announce_aggregator(listener.address(), listener.port());
      ++stats.rejoins;
      std::fprintf(stderr, "gradlane ps aggregator: rejoined the job %.3f s after losing it\n",
                   std::chrono::duration<double>(Clock::now() - lost_at).count());
      return;
    } catch (const Error& e) {
      if (!out_of_reach(e) || Clock::now() >= deadline) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

void Aggregator::State::tell_forwarded(MemberPeer& peer, std::uint64_t member, const PushResult& pushed) {
  try {
    peer.conn.send(encode(Forwarded{member, pushed.lost ? 0 : pushed.sequence, !pushed.lost}));
  } catch (const Error& e) {
    lose(peer, e);
  }
}

// Workers that come after the start: to a restarted aggregator, the ones that lost it (the
// server told them where it listens again), in either mode. One connecting under the id of a
// connection that still looks alive supersedes it.
std::size_t Aggregator::State::admit_joiners() {
  if (!late || ++rounds % 64 != 0) return 0;
  std::size_t work = 0;
  for (Joined& j : late->poll()) {
    ++work;
    if (j.hello.kind != PeerKind::worker) {
      late->refuse(j.conn, Error(Errc::protocol, "only workers join an aggregator"));
      continue;
    }
    for (MemberPeer& old : peers) {
      if (old.alive && old.worker == j.hello.worker) {
        lose(old, Error(Errc::protocol,
                        fmt::format("worker {} connected again: this older connection is superseded", j.hello.worker)));
      }
    }
    MemberPeer peer{std::move(j.conn), j.hello.worker, true, {}};
    // Sidecar mode: the partition its connection was advertised (see SidecarMembers::accept).
    if (sidecar) peer.partition = sidecar->late_partition(j.accepted);
    peers.push_back(std::move(peer));
    ++stats.peers_joined;
    std::fprintf(stderr, "gradlane ps aggregator: worker %u joined\n", j.hello.worker);
  }
  return work;
}

Aggregator::Aggregator(const Device& device, std::uint16_t port, const AggregatorOptions& options) {
  if (options.id == 0 || options.floats == 0 || options.group == 0) {
    throw Error(Errc::invalid_argument, "ps::Aggregator: the id must be > 0, the shard must have floats, group >= 1");
  }
  if (!options.sidecar && options.slots != 0 && options.slots < options.group) {
    throw Error(Errc::invalid_argument, fmt::format("ps::Aggregator: {} member slots cannot hold a group of {}; "
                                                    "give slots >= group (or 0 for 2 × group)",
                                                    options.slots, options.group));
  }
  if (options.grant_windows && !options.sidecar) {
    throw Error(Errc::invalid_argument,
                "ps::Aggregator: grant_windows needs sidecar mode (in direct mode the members "
                "share the ring's slots by sequence, so there is no partition to confine a "
                "worker to)");
  }
  if (options.grant_windows && !device.info().memory_windows) {
    throw Error(Errc::unsupported, fmt::format("ps::Aggregator: grant_windows: {} has no type-2 memory windows; "
                                               "without them any worker may write any member slot",
                                               device.info().name));
  }
  state_ = std::make_unique<State>(device, port, options);
  state_->forward.announce_aggregator(state_->listener.address(), state_->listener.port());
}

Aggregator::Aggregator(Aggregator&&) noexcept = default;
Aggregator& Aggregator::operator=(Aggregator&&) noexcept = default;
Aggregator::~Aggregator() = default;

std::uint16_t Aggregator::port() const { return state_->listener.port(); }

void Aggregator::accept_workers(std::size_t workers, Millis timeout) {
  State& s = *state_;
  s.sidecar ? s.sidecar->accept(s, workers, timeout) : s.direct->accept(s, workers, timeout);
}

std::size_t Aggregator::progress() {
  State& s = *state_;
  return s.sidecar ? s.sidecar->progress(s) : s.direct->progress(s);
}

bool Aggregator::run(Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  std::uint32_t idle = 0;
  while (!finished()) {
    if (progress() != 0) continue;
    if (++idle % 64 == 0 && Clock::now() > deadline) return false;
  }
  return true;
}

bool Aggregator::finished() const {
  const State& s = *state_;
  if (s.sidecar) return s.sidecar->finished(s);
  return !s.peers.empty() && live_workers() == 0 && s.direct->idle();
}

const AggregatorStats& Aggregator::stats() const { return state_->stats; }
const std::vector<AggregatedUpdate>& Aggregator::history() const { return state_->history; }
std::span<const float> Aggregator::last_sum() const { return state_->forward.gradient(); }
std::size_t Aggregator::live_workers() const {
  std::size_t n = 0;
  for (const MemberPeer& p : state_->peers) n += p.alive ? 1 : 0;
  return n;
}

}  // namespace gradlane::ps
