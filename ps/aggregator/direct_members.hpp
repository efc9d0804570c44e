// The direct mode of a ps::Aggregator: towards its workers it is a small server. It grants
// member sequences in request order while their slot in its ring (shared by every member) is
// free, takes a doorbell only from the worker its sequence was granted to, and releases members
// in sequence order (ApplyOrder), holes skipped, into groups of AggregatorOptions::group; each
// group is summed and forwarded to the shard as one push. Internal to the library.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "gradlane/ps/aggregator.hpp"
#include "ps/aggregator/member_group.hpp"
#include "ps/aggregator/member_peer.hpp"
#include "ps/protocol/messages.hpp"
#include "ps/protocol/regions.hpp"
#include "ps/receiving/apply_order.hpp"

namespace gradlane::ps {

class DirectMembers {
 public:
  using Clock = std::chrono::steady_clock;

  DirectMembers(const Device& device, const AggregatorOptions& options, std::uint32_t slots);

  // The workers of the start, each told where the ring is; later ones join through LateJoins.
  void accept(Aggregator::State& s, std::size_t workers, Millis timeout);
  std::size_t progress(Aggregator::State& s);
  // No member granted, waiting, arriving or held in a group.
  bool idle() const { return waiting_.empty() && granted_.empty() && order_.pending() == 0 && group_.empty(); }
  // `peer` is lost: whether it owed us anything (a grant outstanding, a request waiting), and
  // its granted members left out of their group, in order.
  bool owes(const std::vector<MemberPeer>& peers, const MemberPeer& peer) const;
  void forget(MemberPeer& peer);

 private:
  struct Waiting {
    std::size_t peer = 0;
    Request request;
  };

  std::size_t take_input(Aggregator::State& s);
  std::size_t take_from(Aggregator::State& s, std::size_t index);
  std::size_t grant(Aggregator::State& s);
  std::size_t expire_holes(Aggregator::State& s);
  std::size_t collect(Aggregator::State& s);
  bool group_due(const Aggregator::State& s) const;
  void forward_group(Aggregator::State& s);
  // The oldest member sequence whose slot is still busy (member_group.hpp).
  std::uint64_t held_from() const { return group_.empty() ? order_.next_sequence() : group_.first_sequence(); }

  std::uint32_t slot_count_;
  Millis hole_timeout_, linger_;
  SlotRing ring_;
  ApplyOrder order_;
  MemberGroup group_;
  std::deque<Waiting> waiting_;
  std::uint64_t next_grant_ = 1;
  std::map<std::uint64_t, GroupMember> granted_;  // granted, not yet released by `order_`
  Clock::time_point last_member_ = Clock::now();
};

}  // namespace gradlane::ps
