// gradlane — aggregation off the server (ps::Aggregator): sums k workers' updates and forwards
// each sum as one update. The protocol: gradlane/ps.hpp and docs/parameter-server.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradlane/device.hpp"
#include "gradlane/options.hpp"
#include "gradlane/ps/worker.hpp"
#include "gradlane/sidecar.hpp"

namespace gradlane::ps {

struct AggregatorOptions {
  std::uint32_t id = 0;  // its worker id at the server: unique among the shard's workers, > 0
  Endpoint server;
  std::optional<Endpoint> replica;  // the aggregate is mirrored there, as any worker's update
  std::size_t floats = 0;           // the shard's size
  std::uint32_t tensor = 0;         // the shard's tensor (ShardOptions::tensor), for its forward
  std::uint32_t group = 4;          // k: member updates summed into one forwarded update
  std::uint32_t slots = 0;          // member slots in the ring, >= group (0: 2 × group, so the next
                                    // group is written while one is summed and forwarded)
  // A granted member whose write has not arrived by then is left out of its group.
  std::chrono::milliseconds hole_timeout{3000};
  // A short group is forwarded when no member is granted or waiting and none has arrived for
  // this long (or at once when every worker has left), so no gradient waits without bound.
  std::chrono::milliseconds linger{500};
  Millis timeout{30000};  // bound on each wait (connect, the forward's grant and write)
  TransportOptions transport{};
  // Sidecar mode: attach to the host's gradlaned as this job and endpoint (gradlaned started
  // with --aggregator JOB:ENDPOINT). Its scheduler forms the groups: it redirects members here
  // when the server is busy and grants each aggregate a server sequence and slot; `group` and
  // `linger` are unused, `slots` counts member slots per worker (0: 16) — aggregate id % slots
  // is a worker's slot for that aggregate, so a worker may have that many aggregates in flight
  // here. A member that has not come by hole_timeout after its aggregate's slot is left out;
  // an aggregate none of whose members came is completed as failed (the server skips it).
  std::optional<sidecar::AttachOptions> sidecar;
  // Sidecar mode: the workers that may push through it at once (0: as many as accept_workers()
  // takes). Each connection gets its own partition of the ring, 4 more are spare; a worker's
  // partition comes back once it is gone and the members it wrote were forwarded, so workers
  // may come back any number of times. A restarted aggregator (accept_workers(0)) needs it to
  // have room for its workers coming back.
  std::uint32_t workers = 0;
  // Sidecar mode: each worker may write only its own partition. Every partition is a region of
  // its own that no key opens; a worker is given, when it connects, the key of a type-2 memory
  // window bound on its connection over its partition alone. The NIC refuses a write to another
  // worker's member slots (or from another connection), and the writer's connection fails. No
  // cost per push: the window is bound once per connection. Needs type-2 windows
  // (Error(unsupported)); not in direct mode, where members share the ring's slots by sequence
  // (Error(invalid_argument)).
  bool grant_windows = false;
  // When the forward has lost both the server and the replica (out_of_reach: a link down) —
  // or, in sidecar mode, lost its link to a server that lives, its replica never promoted — it
  // connects to the running job again for up to this long (0: never) instead of failing
  // progress(); the group it was forwarding is reported lost to its members.
  Millis rejoin_within{0};
};

struct AggregateMember {
  std::uint32_t worker = 0;
  std::uint64_t tag = 0;
  std::uint64_t computed_on = 0;
};

// One forwarded update: what the aggregator summed and what the server will apply it as.
// Sidecar mode: tag is the sidecar's aggregate id (PushResult::aggregate at the members'
// workers); a member's tag and computed_on are 0 (the aggregator only sees its write).
struct AggregatedUpdate {
  std::uint64_t tag = 0;                 // the group's number (1, 2, …): the tag the server records
  std::uint64_t sequence = 0;            // the server's sequence for it (0 if the push was lost)
  std::uint64_t computed_on = 0;         // the oldest member's
  std::vector<AggregateMember> members;  // in the order they were summed (worker id, then tag)
  bool lost = false;                     // the server failed mid-push (the replica took over)
};

struct AggregatorStats {
  std::uint64_t granted = 0;            // member slots handed out (sidecar mode: aggregate grants)
  std::uint64_t summed = 0;             // member updates summed into forwarded updates
  std::uint64_t skipped = 0;            // granted members that never came (left out of their group)
  std::uint64_t forwarded = 0;          // updates pushed to the server
  std::uint64_t short_groups = 0;       // of them, with fewer than `group` members
  std::uint64_t lost = 0;               // forwards lost to a server failure
  std::uint64_t refused_doorbells = 0;  // for a member sequence not granted to that worker, or done
  std::uint64_t peers_lost = 0;         // workers that failed with work outstanding or misbehaved
  std::uint64_t peers_left = 0;         // workers that disconnected with nothing outstanding
  std::uint64_t peers_joined = 0;       // direct mode: workers admitted after accept_workers (they
                                        // come back to a restarted aggregator)
  std::uint64_t cancelled = 0;          // sidecar mode: aggregates none of whose members came
  std::uint64_t displaced = 0;          // sidecar mode: members overwritten in their slot before their
                                        // aggregate was due (a worker had more than `slots` in flight)
  std::uint64_t rejoins = 0;            // the forward connected to the job again (rejoin_within)
  // Bytes the CPU copied: a group of one member (its "sum" is a copy of the member's slot)
  // and the forward's inline payloads (Worker::bytes_copied). 0 with full groups of > 16 floats.
  std::uint64_t bytes_copied = 0;
};

class Aggregator {
 public:
  // Registers the member ring on `device`, listens on `port` (0 = any; see port()), and
  // connects to the server (and replica) as worker options.id: the server must be accepting.
  Aggregator(const Device& device, std::uint16_t port, const AggregatorOptions& options);
  Aggregator(Aggregator&&) noexcept;
  Aggregator& operator=(Aggregator&&) noexcept;
  ~Aggregator();

  std::uint16_t port() const;
  // Accepts `workers` worker connections, each within `timeout` (Error(timeout) otherwise).
  // From then on progress() keeps admitting workers, and at its start the aggregator told the
  // server where it listens — the server passes that to its workers, so a restarted aggregator
  // (accept_workers(0); in sidecar mode with AggregatorOptions::workers) is found again by the
  // workers that lost it.
  void accept_workers(std::size_t workers, Millis timeout);
  // Does what is due without waiting, except that a group ready to forward is summed and
  // pushed before it returns (at most one per call; the push waits for the server's grant).
  // Returns how many things it did (0 = idle). Throws only when the server and its replica
  // are both unreachable.
  std::size_t progress();
  // progress() until finished(), or `timeout` passes; false on timeout.
  bool run(Millis timeout);
  // Some worker came, none is left, and every member that came was forwarded.
  bool finished() const;

  const AggregatorStats& stats() const;
  const std::vector<AggregatedUpdate>& history() const;  // forwarded updates, in order
  // The registered buffer the last group was summed into and written from (valid until the
  // next progress()).
  std::span<const float> last_sum() const;
  std::size_t live_workers() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace gradlane::ps
