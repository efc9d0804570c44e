// The state of a ps::Aggregator, shared by its two modes: direct (aggregator.cpp: it grants
// member slots and forms groups of `group` itself) and sidecar (aggregator_sidecar.cpp: the
// host's gradlaned forms the groups; AggregateBook pairs its redirected members with its
// aggregate grants). Internal to the library.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "gradlane/ps/aggregator.hpp"
#include "ps/aggregator/aggregate_book.hpp"
#include "ps/receiving/apply_order.hpp"
#include "ps/protocol/join.hpp"
#include "ps/aggregator/member_group.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/receiving/outstanding_grants.hpp"
#include "ps/aggregator/partition_pool.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::ps {

struct MemberPeer {
  Connection conn;
  std::uint32_t worker = 0;
  bool alive = true;
  OutstandingGrants outstanding;  // direct mode
  std::uint32_t partition = 0;    // sidecar mode: its member slots' partition of the ring
  bool partition_back = false;    // sidecar mode: gone, and its partition given back to the pool
  bool said_bye = false;          // the worker said it finished: its disconnect is a leave
};

struct Aggregator::State {
  using Clock = std::chrono::steady_clock;
  struct Waiting {
    std::size_t peer = 0;
    Request request;
  };

  State(const Device& dev, std::uint16_t port, const AggregatorOptions& o);

  Device device;
  AggregatorOptions options;
  // Direct mode: the ring's slots, shared by all members. Sidecar mode: per worker.
  std::uint32_t slot_count;
  std::optional<SlotRing> ring;  // sidecar mode: allocated once the workers are known
  ApplyOrder order;
  MemberGroup group;
  Listener listener;
  Worker forward;  // to the server and the replica; its gradient() is where a group is summed
  std::vector<MemberPeer> peers;
  std::optional<LateJoins> late;  // after accept_workers
  // Sidecar mode: the ring's partitions (shared with the advertising callback LateJoins keeps),
  // and the number of the first late joiner's advertisement (Joined::accepted counts from it).
  std::shared_ptr<PartitionPool> partitions;
  // grant_windows: the window over each partition, bound on the connection it was advertised
  // to (shared with the advertising callback too); dropped once the partition comes back.
  std::shared_ptr<std::vector<std::optional<MemoryWindow>>> partition_windows;
  std::size_t first_late_advertised = 0;
  std::uint32_t rounds = 0;  // progress() calls: late joins are looked at every 64
  IdleProbe idle_probe;      // probe_idle_members
  std::deque<Waiting> waiting;
  std::uint64_t next_grant = 1;
  std::map<std::uint64_t, GroupMember> granted;  // granted, not yet released by `order`
  Clock::time_point last_member = Clock::now();
  AggregatorStats stats;
  std::vector<AggregatedUpdate> history;
  // Sidecar mode.
  std::optional<sidecar::Client> sidecar;
  std::optional<AggregateBook> book;

  bool sidecar_mode() const { return options.sidecar.has_value(); }
  void lose(MemberPeer& peer, const Error& why);
  // IdleProbe on every member: one whose host or link died without a disconnect is lost,
  // instead of being waited for (its partition, its members, finished()) for good. Both modes.
  std::size_t probe_idle_members();
  // Sidecar mode: partitions of workers gone whose member slots are all free, back to the pool.
  std::size_t reclaim_partitions();
  // Tells a member's worker what became of it (`member`: its member sequence or aggregate id),
  // once its forward completed: until then its push is not acknowledged (ps.hpp).
  void tell_forwarded(MemberPeer& peer, std::uint64_t member, const PushResult& pushed);

  // Direct mode (aggregator.cpp).
  // The oldest member sequence whose slot is still busy (member_group.hpp).
  std::uint64_t held_from() const { return group.empty() ? order.next_sequence() : group.first_sequence(); }
  std::size_t take_from(std::size_t index);
  std::size_t admit_joiners();
  std::size_t take_input();
  std::size_t grant();
  std::size_t expire_holes();
  std::size_t collect();
  bool group_due() const;
  void forward_group();
  // forward.push() (direct mode) or forward.write_as() (sidecar mode), or, with rejoin_within,
  // a lost push once the forward has connected to the job again after losing its server.
  PushResult push_forward(std::uint64_t computed_on, std::uint64_t tag);
  PushResult write_forward(std::uint64_t sequence, std::uint64_t token);
  template <typename Push>
  PushResult rejoining_if_out_of_reach(Push&& push);
  void rejoin_forward(const Error& why);
  std::size_t progress_direct();

  // Sidecar mode (aggregator_sidecar.cpp).
  void accept_sidecar_workers(std::size_t workers, Millis timeout);
  std::size_t take_doorbells();
  std::size_t take_grants();
  std::size_t forward_due();
  void forward_aggregate(const DueAggregate& due);
  std::size_t progress_sidecar();
  bool finished_sidecar() const;
};

}  // namespace gradlane::ps
