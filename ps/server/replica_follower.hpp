// ReplicaFollower: what a replica knows of its server's decisions and of its workers' mirrors,
// and what it makes of them for its apply order. Each sequence the server decided arrives here
// (its mirror came, or is read from the server's slot) or is skipped, in order, as the server
// did; promoted, the replica takes over the mirrors the dead server had not decided yet.
//
// Pure: the time is an argument, and reading an update from the server's slot is the caller's
// (fetch). Not thread-safe; one owner (the replica's poll loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "ps/protocol/messages.hpp"
#include "ps/receiving/apply_order.hpp"

namespace gradlane::ps {

class ReplicaFollower {
 public:
  using Clock = std::chrono::steady_clock;

  // The server's decision for `decision.sequence` (worker 0: skipped).
  void decided(const Decided& decision) { decisions_[decision.sequence] = decision; }
  // Every decision that came was handed to the apply order.
  bool all_fed() const noexcept { return decisions_.empty(); }

  // A mirror's doorbell for `sequence` from `worker` (the caller checked its window and claim),
  // with the tag its worker said it is, if it did (sidecar mode: Pushing, sent ahead of the
  // mirror). Kept until the sequence is fed; a promotion tags an undecided mirror with it.
  void mirror_rang(std::uint64_t sequence, std::uint32_t worker, std::optional<std::uint64_t> tag = std::nullopt) {
    mirrored_[sequence] = Mirror{worker, tag};
  }
  bool mirrored(std::uint64_t sequence) const { return mirrored_.contains(sequence); }

  // Workers mirror every update to a replica they started with (unless told to let it read
  // them from the server's slot); to one that joined running, only from the sequence each
  // announced (Mirroring) on. A worker whose connection here was lost mirrors nothing more
  // until it connects again (and, here joined running, says from where).
  void joined_running() noexcept { joined_running_ = true; }
  void mirrors_from(std::uint32_t worker, std::uint64_t from) { mirrors_from_[worker] = from; }
  void mirrors_stopped(std::uint32_t worker) {
    mirrors_from_.erase(worker);
    stopped_.insert(worker);
  }
  void mirrors_resumed(std::uint32_t worker) { stopped_.erase(worker); }
  bool mirror_coming(const Decided& decision, bool workers_mirror) const;

  // Hands `order` the decided sequences at its head, in order: a skip is cancelled, a mirrored
  // update arrives. An applied one whose mirror has not come is given `patience` from the first
  // time it was found waiting (none when no mirror of it is coming), then fetch(sequence) reads
  // it into its slot from the server's — if `can_fetch` (a server to read from): otherwise it
  // waits. Returns how many it fed.
  using Fetch = std::function<void(std::uint64_t sequence)>;
  std::size_t feed(ApplyOrder& order, Clock::time_point now, Clock::duration patience, bool workers_mirror,
                   bool can_fetch, const Fetch& fetch);
  // The decision fed for `sequence`, once: when it is applied.
  std::optional<Decided> take_fed(std::uint64_t sequence);
  // The decisions fed and not applied yet, by sequence.
  const std::map<std::uint64_t, Decided>& fed() const noexcept { return fed_; }

  // Promoted, the server gone: the decided sequences are fed as decided, but one whose mirror
  // is not here is skipped (lost: counted). Then every mirror here that the server had not
  // decided, in order — acknowledged to its worker — arrives; the gaps before them are skipped,
  // up to the ring's end. Such an update's tag is the one its worker said (mirror_rang); else one
  // past its worker's last decided tag (here, or else earlier_tag(worker), or 0), which is wrong
  // after a push of that worker's was dropped or lost. Returns the updates lost.
  using EarlierTag = std::function<std::optional<std::uint64_t>(std::uint32_t worker)>;
  std::uint64_t take_over(ApplyOrder& order, const EarlierTag& earlier_tag);

  // The server is told what the replica applied, once per sequence: `applied_through` if it is
  // past what it was told. A replica that joined running starts at the version it read.
  std::optional<std::uint64_t> ack_due(std::uint64_t applied_through);
  void acknowledged(std::uint64_t through) noexcept { acked_ = through; }

 private:
  std::map<std::uint64_t, Decided> decisions_;  // decided, not yet fed to the order
  std::map<std::uint64_t, Decided> fed_;        // fed, until applied
  struct Mirror {
    std::uint32_t worker = 0;          // whose mirror rang
    std::optional<std::uint64_t> tag;  // what its worker said it is
  };
  std::map<std::uint64_t, Mirror> mirrored_;             // by sequence
  std::optional<Clock::time_point> head_waiting_since_;  // head decided "apply", its data not here
  std::map<std::uint32_t, std::uint64_t> mirrors_from_;
  std::set<std::uint32_t> stopped_;  // workers whose connection here was lost
  bool joined_running_ = false;
  std::uint64_t acked_ = 0;
};

}  // namespace gradlane::ps
