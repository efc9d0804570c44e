// TenantArbiter: which queued part a host's NIC sends next, when several jobs share the host.
//
// Two levels, both from the seeds:
//  - Between jobs (MLNet flow prioritization, seed 001): shortest remaining job first. A job's
//    remaining work is what it declared with its latest request (Request::job_remaining: the
//    steps it has left, which only the application knows), or the bytes it has queued on this
//    NIC if that is more or nothing was declared. Finishing short jobs first minimizes the
//    average completion time; fair sharing delays every job. Without declarations two jobs with
//    one update each queued tie, and the tie goes to the lower job id.
//  - Within a job (ByteScheduler / P3, seeds 002 and 004): lowest priority value first (the
//    earlier layer, needed first by the next forward pass), then request id (arrival order),
//    then part index.
//
// No-starvation floor. Pure SRJF starves a large job forever while small ones keep arriving.
// Each backlogged job j is owed a share `floor` of everything this NIC sends while j is
// backlogged: every grant of b bytes adds floor*b to what each backlogged job is owed and
// subtracts b from the job that got it. A job owed at least its next part goes before SRJF
// (the most-owed first). So a job that stays backlogged gets at least `floor` of the NIC's
// bytes minus one part. A job that goes idle forgets its debt (no banking credit while idle),
// and what a job can owe back is capped at `burst`, so a long SRJF run in its favour does not
// lock it out of the floor later.
//
// Two baselines share the queues, chosen by JobSharing: per-job fair sharing (every backlogged
// job gets equal bytes, whatever its flows or work left: start-time fair queuing, a job that
// becomes backlogged starting at the least any backlogged job has been served) and strict
// priority (an operator's fixed order of jobs). Neither uses the floor or the declarations.
//
// Deterministic: every choice breaks ties by job id, then (priority, request id, part).
//
// A request's parts are queued as one run (push_parts), which hands out its parts one by one:
// queuing a 16 GiB request costs what queuing a 4 KiB one does, not 4,096 pushes inside the
// loop that serves every job.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "sidecar/core/types.hpp"

namespace gradlane::sched {

// How a host NIC is shared between the jobs queued on it.
enum class JobSharing : std::uint8_t {
  shortest_remaining,  // least work left first, with the no-starvation floor (gradlane's)
  fair,                // equal bytes per backlogged job (the per-job fair sharing baseline)
  priority,            // strict priority in a fixed order of jobs (the operator's baseline)
};

struct QueuedPart {
  std::uint32_t priority = 0;
  RequestId request{};
  std::uint32_t index = 0;
  std::uint32_t count = 0;
  Bytes offset = 0;
  Bytes length = 0;
};

// Parts [index, end) of a request, the next at `offset`: every part `chunk` bytes but the last,
// which ends at `end_offset` (Partitioner's near-equal parts).
struct QueuedRun {
  std::uint32_t priority = 0;
  RequestId request{};
  std::uint32_t index = 0;
  std::uint32_t end = 0;
  std::uint32_t count = 0;  // parts of the whole request
  Bytes offset = 0;
  Bytes chunk = 0;
  Bytes end_offset = 0;
  QueuedPart front() const noexcept;
};

class TenantArbiter {
 public:
  // floor_share: the guaranteed share of each backlogged job, in [0, 1]. With n backlogged
  // jobs the guarantee holds for each as long as n * floor_share <= 1.
  // burst: cap on how far a job may be in credit (typically the largest part size).
  explicit TenantArbiter(double floor_share = 0.0, Bytes burst = 0) noexcept
      : floor_share_(floor_share), burst_(static_cast<double>(burst)) {}
  // A baseline: fair, or priority in `order` (first served first; jobs not listed come after
  // every listed one, lower id first).
  TenantArbiter(JobSharing sharing, std::vector<JobId> order)
      : floor_share_(0.0), burst_(0.0), sharing_(sharing), order_(std::move(order)) {}

  // `declared`: the job's remaining work as its latest request declared it (0: not declared);
  // a job that goes idle forgets it, like its debt.
  void push(JobId job, const QueuedPart& part, Bytes declared = 0);
  // Queues a run of parts at once (a whole request: index 0, end = count, offset 0).
  void push_parts(JobId job, const QueuedRun& run, Bytes declared = 0);

  struct Head {
    JobId job;
    QueuedPart part;
  };
  // The part this NIC should send next, or nullopt when nothing is queued.
  std::optional<Head> head() const;
  // Removes the first part of `job`'s queue (what head() returned for that job) and returns it.
  QueuedPart pop(JobId job);
  // Accounts `bytes` just granted to `job` on this NIC (sent directly or to an aggregator).
  void served(JobId job, Bytes bytes);
  // Removes every queued part of `request` (it was dropped); returns them in part order.
  std::vector<QueuedPart> remove_request(JobId job, RequestId request);

  bool empty() const noexcept { return jobs_.empty(); }
  // What SRJF compares: max(declared, queued bytes).
  Bytes remaining(JobId job) const noexcept;
  double owed(JobId job) const noexcept;
  std::size_t queued_parts() const noexcept;

 private:
  struct JobQueue {
    JobId job{};
    std::vector<QueuedRun> heap;  // min-heap by (priority, request, index)
    Bytes remaining = 0;          // queued bytes
    Bytes declared = 0;           // the latest non-zero Request::job_remaining
    double owed = 0.0;
    double served = 0.0;  // fair: bytes granted, from the backlogged minimum when it joined
    Bytes work() const noexcept { return remaining > declared ? remaining : declared; }
  };
  const JobQueue* find(JobId job) const noexcept;
  JobQueue* find(JobId job) noexcept;
  void forget_if_idle(std::size_t i);
  const JobQueue* shortest_remaining() const noexcept;
  const JobQueue* least_served() const noexcept;
  const JobQueue* first_in_order() const noexcept;
  std::size_t rank(JobId job) const noexcept;

  double floor_share_;
  double burst_;
  JobSharing sharing_ = JobSharing::shortest_remaining;
  std::vector<JobId> order_;
  std::vector<JobQueue> jobs_;  // only backlogged jobs, sorted by job id
};

}  // namespace gradlane::sched
