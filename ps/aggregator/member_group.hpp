// MemberGroup: the aggregator's open group of member updates, and the rules that make its sum
// reproducible (the pure part of ps::Aggregator, include/gradlane/ps.hpp).
//
// Members join in the aggregator's member-sequence order (the order ApplyOrder releases them),
// which depends on arrival timing. The sum must not: it is taken in a FIXED order — by worker
// id, then the worker's tag, then member sequence — so anyone holding the same members
// computes bitwise the same floats with the same kernel (sum_in_order), whatever the network
// did. The aggregate's computed_on is the OLDEST member's, so the staleness the server and the
// sidecar see for it is never understated (a newer member only makes it fresher than claimed).
//
// Slots: every member's slot stays busy until the group is summed. The aggregator grants
// member sequence `s` only while member_slot_free(s, held_from(), slots): sequences map onto
// slots `s % slots`, and the oldest busy one is the open group's first member (or, with the
// group empty, the next sequence not yet released by the order).
//
// Pure: no verbs, threads or clocks. Not thread-safe; one owner (the aggregator's poll loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradlane::ps {

struct GroupMember {
  std::uint64_t sequence = 0;  // member sequence at the aggregator
  std::uint32_t slot = 0;      // member slot it was written into
  std::uint32_t worker = 0;
  std::uint64_t tag = 0;          // the worker's tag (e.g. its step)
  std::uint64_t computed_on = 0;  // model version the member gradient was computed on
  std::size_t peer = 0;           // the aggregator's connection it came on (told its outcome)
  friend bool operator==(const GroupMember&, const GroupMember&) = default;
};

class MemberGroup {
 public:
  // size >= 1: members summed per forwarded update (a full group). Throws invalid_argument.
  explicit MemberGroup(std::uint32_t size);

  // Members come in member-sequence order; throws invalid_argument when full or when
  // `member.sequence` is not above the last one added (a caller bug).
  void add(const GroupMember& member);
  bool full() const noexcept { return members_.size() == size_; }
  bool empty() const noexcept { return members_.empty(); }
  std::size_t count() const noexcept { return members_.size(); }
  std::uint32_t size() const noexcept { return size_; }
  // The oldest member's sequence: its slot is the first one the group holds. 0 when empty.
  std::uint64_t first_sequence() const noexcept { return members_.empty() ? 0 : members_.front().sequence; }

  // Empties the group and returns its members in sum order (worker, tag, sequence).
  std::vector<GroupMember> take();

 private:
  std::uint32_t size_;
  std::vector<GroupMember> members_;  // in member-sequence order
};

// The members sorted into the order they are summed: worker id, then tag, then sequence.
std::vector<GroupMember> sum_order(std::vector<GroupMember> members);
// The oldest member's computed_on (what the aggregate claims to be computed on); 0 if none.
std::uint64_t oldest_computed_on(const std::vector<GroupMember>& members) noexcept;

// Whether member sequence `next` may be granted: its slot (next % slots) is free when every
// sequence from `held_from` (the oldest whose slot is still busy) lies less than a ring behind.
inline bool member_slot_free(std::uint64_t next, std::uint64_t held_from, std::uint32_t slots) noexcept {
  return next < held_from + slots;
}

}  // namespace gradlane::ps
