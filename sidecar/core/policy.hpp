// The seam between the daemon's loop and scheduling: the loop turns queue entries into calls on
// a Policy and routes what it decides back to the applications. This is the ONE place the
// loop touches scheduling (Daemon::schedule_and_route in daemon.cpp).
//
// The interface speaks the scheduling core's own value types (sched::Request, sched::Outcome,
// ...) so the production policy, SchedulerPolicy, is a plain forward to
// gradlane::sched::Scheduler with nothing translated. Why an interface at all, rather than the
// loop owning a Scheduler: the queue hop must be measurable without scheduling cost in it
// (perf/sidecar's PassThroughPolicy), and the bad-input tests need a policy whose answer is
// known without reasoning about credits and slots. Cost: one indirect call per entry.
#pragma once

#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "sidecar/core/outcome.hpp"
#include "sidecar/core/scheduler.hpp"
#include "sidecar/core/types.hpp"

namespace gradlane::sched {

class Policy {
 public:
  Policy() = default;
  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;
  virtual ~Policy() = default;

  // A validated request (its id is unique within the daemon).
  virtual sched::SubmitStatus submit(const sched::Request& request, sched::Instant now) = 0;
  // Appends what is decided now; called after submits/completions and when next_wakeup is due.
  virtual void schedule(sched::Instant now, std::vector<sched::Outcome>& out) = 0;
  // A Grant / Redirect / AggregateGrant transfer finished (or failed, or its app died).
  virtual bool complete(sched::TransferId transfer, sched::Instant now, sched::Nanos measured,
                        sched::TransferResult result) = 0;
  // The receiver's server and replica applied every sequence <= seq (frees the window B).
  // False for a sequence never granted there.
  virtual bool replica_ack(sched::EndpointId receiver, sched::Seq seq) = 0;
  // When schedule() should run again even if nothing arrives (nullopt: only on new input).
  virtual std::optional<sched::Instant> next_wakeup() const = 0;
  // A replica on this host was promoted to be `receiver`'s server at `version` (every sequence
  // <= version is decided there): from now on this policy hands out its sequence from
  // version + 1. What was pending for the receiver under its old server is dropped
  // (receiver_moved) by the next schedule(). False if this policy cannot take it over.
  // `job`: the promoted replica's.
  virtual bool take_over(sched::EndpointId receiver, sched::Version version, sched::JobId job, sched::Instant now) = 0;
  // Whether the server app serving `receiver` on this host is alive right now (the daemon sees
  // a dead app only at its next liveness sweep). The daemon gives it; a policy that takes its
  // peers' takeovers asks before handing a receiver served here over.
  using ServerAlive = std::function<bool(sched::EndpointId receiver)>;
  virtual void check_servers_with(ServerAlive /*alive*/) {}
  // `receiver`'s server reuses `slots` slots: never grant its sequence more than that past
  // what it acknowledged (replica_ack), with or without a replica. A policy that hands out no
  // sequences of its own (pass-through: not for real traffic) ignores it.
  virtual void limit_window(sched::EndpointId /*receiver*/, std::uint64_t /*slots*/) {}
  // `receiver`'s server outlived the sidecar that handed out its sequence: grant it nothing
  // until the server attaches taking the sequence over (take_over). Ignored as limit_window.
  virtual void hold_receiver(sched::EndpointId /*receiver*/) {}
  // `receiver`'s server is an app of `job` (nullopt: it left): requests of other jobs for it
  // are refused (Scheduler::serve_job). Ignored as limit_window. `key`: the server's grant
  // key, for a policy that answers peers itself to stamp their grants with (DistributedPolicy);
  // grants to this host's apps are stamped by the daemon.
  virtual void serve_job(sched::EndpointId /*receiver*/, std::optional<sched::JobId> /*job*/,
                         std::optional<sched::GrantKey> /*key*/ = std::nullopt) {}
  // Whether this policy hands `receiver`'s sequence out itself (its grants are this host's to
  // stamp), rather than a peer's sidecar.
  virtual bool hands_out(sched::EndpointId /*receiver*/) const { return true; }
};

// Production: the scheduling core (sidecar/core/scheduler.hpp).
class SchedulerPolicy final : public Policy {
 public:
  explicit SchedulerPolicy(sched::SchedulerConfig config = {}) : scheduler_(config) {}

  sched::SubmitStatus submit(const sched::Request& request, sched::Instant now) override {
    return scheduler_.submit(request, now);
  }
  void schedule(sched::Instant now, std::vector<sched::Outcome>& out) override {
    out.insert(out.end(), moved_.begin(), moved_.end());
    moved_.clear();
    scheduler_.schedule(now, out);
  }
  bool complete(sched::TransferId transfer, sched::Instant now, sched::Nanos measured,
                sched::TransferResult result) override {
    return scheduler_.complete(transfer, now, measured, result);
  }
  bool replica_ack(sched::EndpointId receiver, sched::Seq seq) override {
    return scheduler_.replica_ack(receiver, seq);
  }
  std::optional<sched::Instant> next_wakeup() const override { return scheduler_.next_wakeup(); }
  bool take_over(sched::EndpointId receiver, sched::Version version, sched::JobId, sched::Instant) override {
    scheduler_.close_receiver(receiver, moved_);
    return scheduler_.open_receiver(receiver, version);
  }

  void limit_window(sched::EndpointId receiver, std::uint64_t slots) override {
    scheduler_.limit_window(receiver, slots);
  }
  void hold_receiver(sched::EndpointId receiver) override { scheduler_.hold_receiver(receiver); }
  void serve_job(sched::EndpointId receiver, std::optional<sched::JobId> job,
                 std::optional<sched::GrantKey> /*key*/ = std::nullopt) override {
    scheduler_.serve_job(receiver, job);  // no peers: every grant goes to this host's apps
  }

  sched::Scheduler& scheduler() noexcept { return scheduler_; }

 private:
  sched::Scheduler scheduler_;
  std::vector<sched::Outcome> moved_;  // close_receiver()'s drops, emitted by schedule()
};

// Grants every request whole, at once, in arrival order, with a per-receiver sequence: no
// partitioning, no slots, no staleness. For measuring the queue hop and for tests of the
// plumbing; never a scheduling policy for real traffic.
class PassThroughPolicy final : public Policy {
 public:
  sched::SubmitStatus submit(const sched::Request& request, sched::Instant now) override;
  void schedule(sched::Instant now, std::vector<sched::Outcome>& out) override;
  bool complete(sched::TransferId transfer, sched::Instant now, sched::Nanos measured,
                sched::TransferResult result) override;
  bool replica_ack(sched::EndpointId, sched::Seq) override { return true; }  // no window here
  std::optional<sched::Instant> next_wakeup() const override { return std::nullopt; }
  bool take_over(sched::EndpointId, sched::Version, sched::JobId, sched::Instant) override {
    return false;
  }  // no sequences to move

 private:
  std::vector<sched::Request> pending_;
  std::unordered_map<sched::EndpointId, sched::Seq> sequence_;
  std::uint64_t next_transfer_ = 1;
};

}  // namespace gradlane::sched
