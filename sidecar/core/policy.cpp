#include "sidecar/core/policy.hpp"

namespace gradlane::sched {

sched::SubmitStatus PassThroughPolicy::submit(const sched::Request& request, sched::Instant) {
  if (request.bytes == 0) return sched::SubmitStatus::empty_request;
  if (request.sender == request.receiver) return sched::SubmitStatus::sender_is_receiver;
  pending_.push_back(request);
  return sched::SubmitStatus::accepted;
}

void PassThroughPolicy::schedule(sched::Instant now, std::vector<sched::Outcome>& out) {
  for (const sched::Request& r : pending_) {
    const sched::TransferId transfer{next_transfer_++};
    out.emplace_back(sched::Grant{.transfer = transfer,
                                  .request = r.id,
                                  .part = 0,
                                  .part_count = 1,
                                  .offset = 0,
                                  .length = r.bytes,
                                  .job = r.job,
                                  .tensor = r.tensor,
                                  .sender = r.sender,
                                  .receiver = r.receiver,
                                  .slot = {now, now},
                                  .seq = ++sequence_[r.receiver],
                                  .delay = 0});
  }
  pending_.clear();
}

// Nothing is held per transfer (no credit, no slots), so there is nothing to give back.
bool PassThroughPolicy::complete(sched::TransferId, sched::Instant, sched::Nanos, sched::TransferResult) {
  return true;
}

}  // namespace gradlane::sched
