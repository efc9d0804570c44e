#include "ps/aggregator/aggregate_book.hpp"

#include <algorithm>
#include <tuple>

#include "gradlane/error.hpp"

namespace gradlane::ps {

AggregateBook::AggregateBook(std::uint32_t peers, std::uint32_t slots_per_peer)
    : peers_(peers), slots_(slots_per_peer) {
  if (peers == 0 || slots_per_peer == 0) {
    throw Error(Errc::invalid_argument, "AggregateBook: at least one peer and one member slot per peer");
  }
  held_.resize(std::size_t{peers} * slots_per_peer);
}

Arrival AggregateBook::arrived(std::uint32_t peer, std::uint32_t worker, std::uint32_t imm, Instant now) {
  if (peer >= peers_) throw Error(Errc::invalid_argument, "AggregateBook: no such peer");
  const BookedMember member{peer, worker, imm % slots_};
  auto& held = held_[ring_slot(member)];
  Arrival result = Arrival::accepted;
  if (held && *held == imm) return Arrival::duplicate;
  if (held) {
    // The worker reused the slot before the aggregate holding it was taken: that member's bytes
    // are overwritten, so it no longer counts.
    const auto other = pending_.find(*held);
    if (other != pending_.end()) std::erase(members_of(other->second), member);
    result = Arrival::displaced;
  }
  held = imm;
  auto [it, inserted] = pending_.try_emplace(imm);
  if (inserted) it->second.first_seen = now;
  members_of(it->second).push_back(member);
  return result;
}

bool AggregateBook::holds_any(std::uint32_t peer) const {
  if (peer >= peers_) return false;
  const auto first = held_.begin() + std::ptrdiff_t{peer} * slots_;
  return std::any_of(first, first + slots_, [](const auto& held) { return held.has_value(); });
}

bool AggregateBook::granted(std::uint64_t id, std::uint64_t sequence, std::uint32_t members,
                            std::chrono::nanoseconds slot_start, Instant give_up, std::uint64_t token) {
  const auto imm = static_cast<std::uint32_t>(id);
  auto [it, inserted] = pending_.try_emplace(imm);
  Pending& p = it->second;
  if (p.grant) return false;
  if (inserted) p.first_seen = give_up;
  p.grant = DueAggregate{id, sequence, members, slot_start, std::move(p.early), token};
  p.early.clear();
  p.order = grants_++;
  p.give_up = give_up;
  return true;
}

std::vector<DueAggregate> AggregateBook::take_due(Instant now) {
  std::vector<std::pair<std::uint32_t, DueAggregate>> due;
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    if (!p.grant || (p.grant->members.size() < p.grant->expected && now < p.give_up)) {
      ++it;
      continue;
    }
    free_slots(p.grant->members);
    std::sort(p.grant->members.begin(), p.grant->members.end(), [](const BookedMember& a, const BookedMember& b) {
      return std::tie(a.worker, a.peer) < std::tie(b.worker, b.peer);
    });
    due.emplace_back(p.order, std::move(*p.grant));
    it = pending_.erase(it);
  }
  std::sort(due.begin(), due.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<DueAggregate> out;
  out.reserve(due.size());
  for (auto& [order, aggregate] : due) out.push_back(std::move(aggregate));
  return out;
}

std::size_t AggregateBook::expire_ungranted(Instant now, std::chrono::nanoseconds max_wait) {
  std::size_t struck = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    if (p.grant || now - p.first_seen < max_wait) {
      ++it;
      continue;
    }
    struck += p.early.size();
    free_slots(p.early);
    it = pending_.erase(it);
  }
  return struck;
}

void AggregateBook::free_slots(const std::vector<BookedMember>& members) {
  for (const BookedMember& m : members) held_[ring_slot(m)].reset();
}

}  // namespace gradlane::ps
