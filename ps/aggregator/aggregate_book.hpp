// AggregateBook: what an aggregator in sidecar mode knows about the aggregates the sidecar
// formed (the pure part of ps::Aggregator's sidecar mode, include/gradlane/ps.hpp).
//
// In sidecar mode the aggregator does not choose its groups: the receiver's gradlaned redirects
// members to it (each worker writes its gradient into its own member slot here, doorbell = the
// aggregate id's low 32 bits) and, separately, sends the aggregator one aggregate grant (the
// server's sequence, how many members, a slot). The two arrive in any order. The book pairs
// them and says when an aggregate is due: every member is here, or the grant's give-up time
// passed (a member's worker failed after its redirect, or its write went elsewhere) — then it
// goes with the members that came, or, if none came, is cancelled (the caller completes it as
// failed, and the sidecar tells the server to skip the sequence).
//
// Slots: worker `peer` has `slots_per_peer` member slots; aggregate `id` uses slot
// id % slots_per_peer (computed from the low 32 bits on both sides). A slot is busy from the
// doorbell until its aggregate is taken. A doorbell into a slot still held by another
// aggregate's member means the worker had more aggregates in flight than it has slots: the old
// member's bytes are gone, so it is struck from its aggregate (which goes short) and the new one
// is kept. The sum is taken in a fixed order — by worker id, then peer — so anyone holding the
// same members computes the same bits (sum_in_order).
//
// Pure: no verbs, threads or clock reads (times are passed in). One owner.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace gradlane::ps {

struct BookedMember {
  std::uint32_t peer = 0;    // the worker's connection index at the aggregator
  std::uint32_t worker = 0;  // its worker id
  std::uint32_t slot = 0;    // its member slot (within the peer's slots)
  friend bool operator==(const BookedMember&, const BookedMember&) = default;
};

struct DueAggregate {
  std::uint64_t aggregate = 0;             // the sidecar's aggregate id
  std::uint64_t sequence = 0;              // the server's sequence for the sum
  std::uint32_t expected = 0;              // members the sidecar redirected
  std::chrono::nanoseconds slot_start{0};  // the forward's slot (steady clock)
  std::vector<BookedMember> members;       // those that came, in sum order (worker, peer)
  std::uint64_t token = 0;                 // the grant's token for the server (sidecar::Grant::token)
};

enum class Arrival : std::uint8_t {
  accepted,   // booked
  duplicate,  // that peer already rang for that aggregate: refused
  displaced,  // booked; the slot held another aggregate's member, which was struck
};

class AggregateBook {
 public:
  using Instant = std::chrono::steady_clock::time_point;

  // peers, slots_per_peer >= 1 (Error(invalid_argument) otherwise).
  AggregateBook(std::uint32_t peers, std::uint32_t slots_per_peer);

  // Peer `peer` (worker `worker`) rang with `imm`, the low 32 bits of the aggregate id.
  Arrival arrived(std::uint32_t peer, std::uint32_t worker, std::uint32_t imm, Instant now);
  // The sidecar's grant for aggregate `id`: forward as `sequence` once `members` members came,
  // or at `give_up` with those that came. False (nothing changes) for a second grant of the
  // same id while the first is pending.
  bool granted(std::uint64_t id, std::uint64_t sequence, std::uint32_t members, std::chrono::nanoseconds slot_start,
               Instant give_up, std::uint64_t token = 0);
  // The granted aggregates due at `now` (complete, or past their give-up time), in grant order;
  // removed from the book with their slots freed.
  std::vector<DueAggregate> take_due(Instant now);
  // Members of aggregates that got no grant within `max_wait` of their first member: struck,
  // slots freed. Returns how many were struck.
  std::size_t expire_ungranted(Instant now, std::chrono::nanoseconds max_wait);

  // Whether any of peer `peer`'s member slots is held by an aggregate not yet taken.
  bool holds_any(std::uint32_t peer) const;
  bool empty() const noexcept { return pending_.empty(); }
  std::size_t pending() const noexcept { return pending_.size(); }
  std::uint32_t slots_per_peer() const noexcept { return slots_; }
  // Index of peer's member slot `slot` in a ring of peers × slots_per_peer slots.
  std::uint32_t ring_slot(const BookedMember& m) const noexcept { return m.peer * slots_ + m.slot; }

 private:
  struct Pending {
    std::optional<DueAggregate> grant;  // members are kept here once granted, else in `early`
    std::vector<BookedMember> early;
    std::uint32_t order = 0;  // grant order
    Instant first_seen{};
    Instant give_up{};
  };
  std::vector<BookedMember>& members_of(Pending& p) { return p.grant ? p.grant->members : p.early; }
  void free_slots(const std::vector<BookedMember>& members);

  std::uint32_t peers_;
  std::uint32_t slots_;
  // Per ring slot: the aggregate (low 32 bits) whose member holds it.
  std::vector<std::optional<std::uint32_t>> held_;
  std::map<std::uint32_t, Pending> pending_;  // by the aggregate id's low 32 bits
  std::uint32_t grants_ = 0;
};

}  // namespace gradlane::ps
