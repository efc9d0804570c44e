// SidecarGrants: a sidecar-mode ps::Worker's grants. Each push asks the host's gradlaned (one
// request per push) and takes its answer: a go (write the server's slot), a redirect (write a
// member slot at the aggregator), a drop, or an error; the grant is completed with the sidecar
// once written, failed if it was not, so the sidecar cancels its sequence and the server skips
// it at once. A grant taken up past grant_lifetime after its slot's start is not written; the
// worker asks again. Internal to the library.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "gradlane/ps/worker.hpp"
#include "gradlane/sidecar.hpp"

namespace gradlane::ps {

class SidecarGrants {
 public:
  using Clock = std::chrono::steady_clock;

  // Attaches to the host's gradlaned (WorkerOptions::sidecar) for a shard of `bytes`.
  SidecarGrants(const WorkerOptions& options, std::size_t bytes);

  // Asks for a grant for the push in flight (Worker::State::push_tag, push_computed_on).
  void ask(Worker::State& s);
  // Waits for the answer and acts on it: the push's result.
  PushResult wait(Worker::State& s);

 private:
  PushResult take_answer(Worker::State& s, const sidecar::Grant& g);
  // A go or a redirect, completed with the sidecar either way, failed if the write threw.
  PushResult write_granted(Worker::State& s, const sidecar::Grant& g);
  // The model was pulled from a server that died since, which had applied updates its replica
  // had not yet when it was promoted (up to the replica bound): the version is ahead of the new
  // server's. Or it was pulled from the promoted replica while the sidecar still hands out the
  // dead server's sequence (its Takeover on the way). Either way the push did not happen; the
  // caller pulls the new server's model and goes on. Or the receiver's sidecar was restarted and
  // answered before it held its surviving server's sequence. Refused so for failover_patience
  // without a failover, it is the application's error.
  PushResult from_the_future(Worker::State& s);

  sidecar::Client client_;
  std::uint64_t request_ = 0;  // the request in flight
  // Since when every push was refused as receiver_unreachable / unknown_receiver, or as
  // version_from_future.
  std::optional<Clock::time_point> refused_since_, future_since_;
  bool warned_redirect_ = false;  // said once that a redirect had nowhere to go
};

}  // namespace gradlane::ps
