// CandidateTable (candidate_table.hpp).
#include "sidecar/core/candidate_table.hpp"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>

namespace gradlane::sched {

std::uint32_t CandidateTable::add(const Candidate& c) {
  table_.push_back(c);
  const auto at = static_cast<std::uint32_t>(table_.size() - 1);
  index(at);
  return at;
}

const Candidate* CandidateTable::remove(std::uint32_t at) {
  // Swap-remove: O(1) in the table; the moved one's index entry is re-pointed.
  const auto last = static_cast<std::uint32_t>(table_.size() - 1);
  unindex(at);
  if (at == last) {
    table_.pop_back();
    return nullptr;
  }
  table_[at] = table_[last];
  table_.pop_back();
  const Candidate& moved = table_[at];
  ReceiverQueue& queue = queues_[moved.receiver];
  (moved.aggregate ? queue.aggregates : queue.parts).at(key(moved)) = at;
  return &moved;
}

void CandidateTable::replace(std::uint32_t at, const Candidate& c) {
  unindex(at);
  table_[at] = c;
  index(at);
}

void CandidateTable::set_duration(std::uint32_t at, Nanos duration) {
  unindex(at);
  table_[at].duration = duration;
  index(at);
}

void CandidateTable::set_deadline(std::uint32_t at, Version deadline) {
  unindex(at);
  table_[at].deadline = deadline;
  index(at);
}

int CandidateTable::rate_class(const Candidate& c) const {
  if (!packed_) return 0;
  const double seconds = std::chrono::duration<double>(c.duration).count();
  if (!(seconds > 0.0)) return kRateClasses - 1;
  const double rate = static_cast<double>(c.length) / seconds;
  if (!(rate >= 1.0)) return 0;
  return std::min(std::ilogb(rate), kRateClasses - 1);  // 2^class <= rate < 2^(class + 1)
}

OrderKey CandidateTable::key(const Candidate& c) const {
  if (ordering_ == Ordering::fifo) return OrderKey{rate_class(c), Nanos{0}, 0.0, c.id, c.part};
  return OrderKey{rate_class(c), c.duration, -c.norm, c.id, c.part};
}

void CandidateTable::index(std::uint32_t at) {
  const Candidate& c = table_[at];
  if (c.receiver >= queues_.size()) queues_.resize(c.receiver + 1);
  ReceiverQueue& queue = queues_[c.receiver];
  if (queue.empty()) receivers_.insert(c.receiver);
  [[maybe_unused]] const bool added = (c.aggregate ? queue.aggregates : queue.parts).emplace(key(c), at).second;
  assert(added);
  if (!c.aggregate) queue.deadlines.emplace(std::pair(c.deadline, c.id), c.sender);
}

void CandidateTable::unindex(std::uint32_t at) {
  const Candidate& c = table_[at];
  ReceiverQueue& queue = queues_[c.receiver];
  [[maybe_unused]] const std::size_t erased = (c.aggregate ? queue.aggregates : queue.parts).erase(key(c));
  assert(erased == 1);
  if (!c.aggregate) queue.deadlines.erase(std::pair(c.deadline, c.id));
  if (queue.empty()) receivers_.erase(c.receiver);
}

}  // namespace gradlane::sched
