// ForwardedRequests: this host's requests that a peer's sidecar schedules, and which parts of
// each its answers have decided. An answer is checked against the request it names before
// anything is recorded: a peer's decoder can only check a message against itself, and the
// parts are indexed by the split the first answer gave.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "sidecar/core/scheduler.hpp"
#include "sidecar/peer/messages.hpp"
#include "sidecar/peer/peer_transport.hpp"

namespace gradlane::peer {

class ForwardedRequests {
 public:
  bool contains(std::uint64_t id) const { return requests_.contains(id); }
  void add(std::uint64_t id, PeerIndex peer, const sched::Request& request);
  // The request `answer` decides a part of, once checked and recorded; the request is forgotten
  // when its last part is decided. Throws Error(Errc::protocol), recording nothing, for an
  // answer to a request not forwarded to `peer`, one that splits it otherwise than an earlier
  // answer or into more parts than it has bytes or the partitioner makes, names bytes outside
  // it, or decides a part a second time.
  sched::Request decide(PeerIndex peer, const SlotAnswer& answer);
  // `peer` is lost: every part it had not decided is dropped (peer_lost), into `out`, and its
  // requests forgotten. A request it never answered is dropped whole (the split was its own).
  void drop_undecided(PeerIndex peer, std::vector<sched::Outcome>& out);

 private:
  struct Forwarded {
    PeerIndex peer = 0;
    sched::Request request;
    std::uint32_t answered = 0;
    std::uint32_t parts = 0;    // known from the first answer
    std::uint64_t chunk = 0;    // every part's length but maybe the last's, once an answer shows it
    std::vector<bool> decided;  // by part index, sized by the first answer
  };
  static void check_fits(const Forwarded& f, const SlotAnswer& answer);

  std::unordered_map<std::uint64_t, Forwarded> requests_;  // by the app's RequestId
};

}  // namespace gradlane::peer
