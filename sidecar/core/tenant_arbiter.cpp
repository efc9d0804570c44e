#include "sidecar/core/tenant_arbiter.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

namespace gradlane::sched {
namespace {

// std heap algorithms build max-heaps; "later" puts the most urgent part on top.
struct Later {
  bool operator()(const QueuedRun& a, const QueuedRun& b) const noexcept {
    return std::tuple(a.priority, to_int(a.request), a.index) > std::tuple(b.priority, to_int(b.request), b.index);
  }
};

}  // namespace

QueuedPart QueuedRun::front() const noexcept {
  return QueuedPart{priority, request, index, count, offset, std::min(chunk, end_offset - offset)};
}

const TenantArbiter::JobQueue* TenantArbiter::find(JobId job) const noexcept {
  const auto it =
      std::lower_bound(jobs_.begin(), jobs_.end(), job, [](const JobQueue& q, JobId j) { return q.job < j; });
  return it != jobs_.end() && it->job == job ? &*it : nullptr;
}

TenantArbiter::JobQueue* TenantArbiter::find(JobId job) noexcept {
  return const_cast<JobQueue*>(std::as_const(*this).find(job));
}

void TenantArbiter::push(JobId job, const QueuedPart& part, Bytes declared) {
  push_parts(job,
             QueuedRun{part.priority, part.request, part.index, part.index + 1, part.count, part.offset, part.length,
                       part.offset + part.length},
             declared);
}

void TenantArbiter::push_parts(JobId job, const QueuedRun& run, Bytes declared) {
  if (run.index >= run.end || run.offset >= run.end_offset) return;
  auto it = std::lower_bound(jobs_.begin(), jobs_.end(), job, [](const JobQueue& q, JobId j) { return q.job < j; });
  if (it == jobs_.end() || it->job != job) {
    // Fair sharing's virtual time: a job joins at the least any backlogged job has been served,
    // so it neither catches up on bytes sent while it was idle nor waits behind them.
    double start = 0.0;
    if (const JobQueue* least = least_served()) start = least->served;
    it =
        jobs_.insert(it, JobQueue{.job = job, .heap = {}, .remaining = 0, .declared = 0, .owed = 0.0, .served = start});
  }
  it->heap.push_back(run);
  std::push_heap(it->heap.begin(), it->heap.end(), Later{});
  it->remaining += run.end_offset - run.offset;
  if (declared != 0) it->declared = declared;
}

std::optional<TenantArbiter::Head> TenantArbiter::head() const {
  const JobQueue* best = nullptr;
  switch (sharing_) {
    case JobSharing::shortest_remaining:
      best = shortest_remaining();
      break;
    case JobSharing::fair:
      best = least_served();
      break;
    case JobSharing::priority:
      best = first_in_order();
      break;
  }
  if (!best) return std::nullopt;
  return Head{best->job, best->heap.front().front()};
}

const TenantArbiter::JobQueue* TenantArbiter::shortest_remaining() const noexcept {
  const JobQueue* best = nullptr;
  // Floor first: the job owed the most, if it is owed at least its next part.
  for (const JobQueue& q : jobs_) {
    if (q.owed >= static_cast<double>(q.heap.front().front().length) && (!best || q.owed > best->owed)) {
      best = &q;
    }
  }
  if (best) return best;
  // Otherwise shortest remaining job first (jobs_ is sorted by id, so ties go to the lower id).
  for (const JobQueue& q : jobs_) {
    if (!best || q.work() < best->work()) best = &q;
  }
  return best;
}

const TenantArbiter::JobQueue* TenantArbiter::least_served() const noexcept {
  const JobQueue* best = nullptr;
  for (const JobQueue& q : jobs_) {
    if (!best || q.served < best->served) best = &q;
  }
  return best;
}

const TenantArbiter::JobQueue* TenantArbiter::first_in_order() const noexcept {
  const JobQueue* best = nullptr;
  for (const JobQueue& q : jobs_) {
    if (!best || rank(q.job) < rank(best->job)) best = &q;
  }
  return best;
}

std::size_t TenantArbiter::rank(JobId job) const noexcept {
  const auto it = std::find(order_.begin(), order_.end(), job);
  return static_cast<std::size_t>(it - order_.begin());  // unlisted: order_.size(), then by id
}

QueuedPart TenantArbiter::pop(JobId job) {
  JobQueue* q = find(job);
  std::pop_heap(q->heap.begin(), q->heap.end(), Later{});
  QueuedRun& run = q->heap.back();
  const QueuedPart part = run.front();
  ++run.index;
  run.offset += part.length;
  if (run.index < run.end && run.offset < run.end_offset) {
    std::push_heap(q->heap.begin(), q->heap.end(), Later{});  // the rest of the run, in its place
  } else {
    q->heap.pop_back();
  }
  q->remaining -= part.length;
  forget_if_idle(static_cast<std::size_t>(q - jobs_.data()));
  return part;
}

void TenantArbiter::served(JobId job, Bytes bytes) {
  const double b = static_cast<double>(bytes);
  for (JobQueue& q : jobs_) {
    q.owed += floor_share_ * b;
    if (q.job == job) {
      q.owed = std::max(q.owed - b, -burst_);
      q.served += b;
    }
  }
}

std::vector<QueuedPart> TenantArbiter::remove_request(JobId job, RequestId request) {
  std::vector<QueuedPart> removed;
  JobQueue* q = find(job);
  if (!q) return removed;
  for (QueuedRun run : q->heap) {
    if (run.request != request) continue;
    for (; run.index < run.end && run.offset < run.end_offset; ++run.index) {
      removed.push_back(run.front());
      run.offset += removed.back().length;
    }
  }
  if (removed.empty()) return removed;
  std::erase_if(q->heap, [request](const QueuedRun& r) { return r.request == request; });
  std::make_heap(q->heap.begin(), q->heap.end(), Later{});
  for (const QueuedPart& p : removed) q->remaining -= p.length;
  std::sort(removed.begin(), removed.end(), [](const QueuedPart& a, const QueuedPart& b) { return a.index < b.index; });
  forget_if_idle(static_cast<std::size_t>(q - jobs_.data()));
  return removed;
}

void TenantArbiter::forget_if_idle(std::size_t i) {
  // An idle job leaves the arbiter and with it its debt or credit: no banking while idle.
  if (jobs_[i].heap.empty()) jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(i));
}

Bytes TenantArbiter::remaining(JobId job) const noexcept {
  const JobQueue* q = find(job);
  return q ? q->work() : 0;
}

double TenantArbiter::owed(JobId job) const noexcept {
  const JobQueue* q = find(job);
  return q ? q->owed : 0.0;
}

std::size_t TenantArbiter::queued_parts() const noexcept {
  std::size_t n = 0;
  for (const JobQueue& q : jobs_) {
    for (const QueuedRun& r : q.heap) n += r.end - r.index;
  }
  return n;
}

}  // namespace gradlane::sched
