#include "ps/aggregator/member_group.hpp"

#include <algorithm>
#include <string>
#include <tuple>

#include "gradlane/error.hpp"

namespace gradlane::ps {

MemberGroup::MemberGroup(std::uint32_t size) : size_(size) {
  if (size == 0) throw Error(Errc::invalid_argument, "MemberGroup: a group needs at least one member");
  members_.reserve(size);
}

void MemberGroup::add(const GroupMember& member) {
  if (full()) throw Error(Errc::invalid_argument, "MemberGroup::add: the group is full; take() it first");
  if (!members_.empty() && member.sequence <= members_.back().sequence) {
    throw Error(Errc::invalid_argument, "MemberGroup::add: member sequence " + std::to_string(member.sequence) +
                                            " after " + std::to_string(members_.back().sequence) +
                                            "; members join in sequence order");
  }
  members_.push_back(member);
}

std::vector<GroupMember> MemberGroup::take() {
  std::vector<GroupMember> members = sum_order(std::move(members_));
  members_.clear();
  members_.reserve(size_);
  return members;
}

std::vector<GroupMember> sum_order(std::vector<GroupMember> members) {
  std::sort(members.begin(), members.end(), [](const GroupMember& a, const GroupMember& b) {
    return std::tuple(a.worker, a.tag, a.sequence) < std::tuple(b.worker, b.tag, b.sequence);
  });
  return members;
}

std::uint64_t oldest_computed_on(const std::vector<GroupMember>& members) noexcept {
  if (members.empty()) return 0;
  std::uint64_t oldest = members.front().computed_on;
  for (const GroupMember& m : members) oldest = std::min(oldest, m.computed_on);
  return oldest;
}

}  // namespace gradlane::ps
