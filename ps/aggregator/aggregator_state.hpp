// The state of a ps::Aggregator: what its two modes share — the member connections, the
// forward to the shard, the stats — and the mode itself: DirectMembers (direct_members.hpp: it
// grants member slots and forms groups of `group` itself) or SidecarMembers
// (sidecar_members.hpp: the host's gradlaned forms the groups). Internal to the library.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "gradlane/ps/aggregator.hpp"
#include "gradlane/ps/worker.hpp"
#include "ps/aggregator/direct_members.hpp"
#include "ps/aggregator/member_peer.hpp"
#include "ps/aggregator/sidecar_members.hpp"
#include "ps/protocol/join.hpp"

namespace gradlane::ps {

struct Aggregator::State {
  using Clock = std::chrono::steady_clock;

  State(const Device& dev, std::uint16_t port, const AggregatorOptions& o);

  Device device;
  AggregatorOptions options;
  Listener listener;
  Worker forward;  // to the server and the replica; its gradient() is where a group is summed
  std::vector<MemberPeer> peers;
  std::optional<LateJoins> late;  // after accept_workers
  std::uint32_t rounds = 0;       // progress() calls: late joins are looked at every 64
  IdleProbe idle_probe;           // probe_idle_members
  AggregatorStats stats;
  std::vector<AggregatedUpdate> history;
  std::optional<DirectMembers> direct;    // one of the two
  std::optional<SidecarMembers> sidecar;  // AggregatorOptions::sidecar

  void lose(MemberPeer& peer, const Error& why);
  // IdleProbe on every member: one whose host or link died without a disconnect is lost,
  // instead of being waited for (its partition, its members, finished()) for good.
  std::size_t probe_idle_members();
  // Workers that come after the start (a restarted aggregator's, or a restarted worker).
  std::size_t admit_joiners();
  // Tells a member's worker what became of it (`member`: its member sequence or aggregate id),
  // once its forward completed: until then its push is not acknowledged (ps.hpp).
  void tell_forwarded(MemberPeer& peer, std::uint64_t member, const PushResult& pushed);
  // forward.push() (direct mode) or forward.write_as() (sidecar mode), or, with rejoin_within,
  // a lost push once the forward has connected to the job again after losing its server.
  PushResult push_forward(std::uint64_t computed_on, std::uint64_t tag);
  PushResult write_forward(std::uint64_t sequence, std::uint64_t token);

 private:
  template <typename Push>
  PushResult rejoining_if_out_of_reach(Push&& push);
  void rejoin_forward(const Error& why);
};

}  // namespace gradlane::ps
