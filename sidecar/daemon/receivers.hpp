// Receivers: who speaks for each receiver endpoint at this gradlaned. The server app attached
// as its server (its job and slot), the job that owns the endpoint while that app is gone
// without detaching, the key of its grant tokens, and the receivers a dead daemon's surviving
// servers left held (survivors.hpp) until that very server takes its sequence over again.
//
// Why a job owns an endpoint past its server's death: the server, or its replica, comes back;
// meanwhile no app of another job may attach as that receiver's server — to narrow its window,
// replace its grant key or take its sequence — and requests of other jobs are refused. A clean
// detach releases it.
//
// Pure bookkeeping: no segment, no scheduler, no clock. One owner (the daemon's loop).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "sidecar/core/types.hpp"
#include "sidecar/daemon/survivors.hpp"

namespace gradlane::sidecar {

class Receivers {
 public:
  // The endpoints a dead daemon's surviving servers hold (endpoints_to_hold()).
  void hold(std::map<std::uint32_t, HeldEndpoint> held) { held_ = std::move(held); }
  // Whether `endpoint` belongs to another job than `job`: its server may not attach from `job`.
  bool owned_by_another(std::uint32_t endpoint, std::uint32_t job) const;
  // Whether the attaching app is the survivor held for `endpoint` — the same process (pid and
  // start time), of its job, through the segment it was found in; if so, the hold ends (it
  // takes its sequence over).
  bool take_survivor(std::uint32_t endpoint, const Survivor& app, std::uint32_t segment);

  // The app in `slot`, of `job`, attached as `endpoint`'s server: the latest to do so speaks for
  // it (a server restarted in place may attach before its dead predecessor is swept). `key`:
  // its grant tokens' (none: its grants carry none).
  void seat(std::uint32_t endpoint, std::uint32_t job, std::uint32_t slot, std::optional<sched::GrantKey> key);
  // The app in `slot` is gone. True if it was `endpoint`'s server; `detached` (it said so)
  // releases its job's ownership of the endpoint too.
  bool unseat(std::uint32_t endpoint, std::uint32_t slot, bool detached);
  // The slot of `endpoint`'s server app (of `job`, if given).
  std::optional<std::uint32_t> server_slot(std::uint32_t endpoint, std::optional<std::uint32_t> job = {}) const;

  // The token of a grant of `seq` at `receiver`: stamped here with its key if this daemon hands
  // its sequence out (`hands_out`), else the one a peer's answer carried (0: none). The key is
  // kept while its server is gone: the tokens belong to the receiver's sequence, which goes on
  // until its promoted replica takes it over.
  std::uint64_t token(std::uint32_t receiver, std::uint64_t seq, std::uint64_t carried, bool hands_out) const;

 private:
  struct Server {
    std::uint32_t job = 0;
    std::uint32_t slot = 0;
  };
  std::map<std::uint32_t, HeldEndpoint> held_;
  std::map<std::uint32_t, Server> servers_;
  std::map<std::uint32_t, std::uint32_t> owners_;
  std::map<std::uint32_t, sched::GrantKey> keys_;
};

}  // namespace gradlane::sidecar
