// BandwidthEstimator: measured egress/ingress rate of every NIC, kept up to date from observed
// transfers with an exponentially weighted moving average of their time per byte.
//
// Why per NIC direction and not per pair: a transfer runs at the rate of its bottleneck,
// min(sender egress, receiver ingress), and with 1,000 workers a per-pair table would never
// warm up. A straggler is a slow egress; a hot server is a slow ingress.
//
// The moving average is over transfer time per byte, not over rates (a weighted harmonic mean):
// the estimate serves to predict how long a transfer holds a link, and an occasional burst at
// line rate must not cut that prediction to a fraction of what most transfers take.
//
// Published rates. rate() returns an estimate that is republished only when the EWMA has
// moved more than `republish_fraction` away from it. Transfer-time predictions do not need
// sub-percent precision, and every republish makes the scheduler recompute the transfer time
// of every pending candidate: with a completion per decision that would cost more than the
// decision itself.
//
// Attribution of one observed transfer (observe_transfer): the observed rate x is a lower
// bound on both sides' capacity, so any side estimated below x is raised towards x. If x is
// below both estimates, only the side currently believed to be the bottleneck (the lower
// estimate) is lowered. On a tie (within 5%; the usual case when the daemon declared equal
// line rates) the sender is blamed: a straggler's slow transfers must not drag down the
// estimate of the healthy server it sends to, which would stretch every slot at that server.
// A genuinely slow server is still found: every sender's transfers to it are slow, and once
// they are believed slow their next slow transfers fall below the server's estimate only.
//
// What a side has carried decides against an unknown side: each side remembers the fastest
// rate it recently carried (decaying, and a declared rate counts as carried). A transfer slower
// than both estimates, between a side never measured nor declared and one that recently carried
// clearly more (1.5x), is blamed on the unknown side. So once a server's ingress is declared or
// seen at its rate, a new straggler's first slow transfer to it lowers the straggler's egress,
// not the server's ingress; from then on the straggler's estimate is the lower one and takes
// the blame by the rule above.
//
// Bad news travels fast: a sample more than `gross_error` times slower than the blamed side's
// estimate replaces the estimate instead of being averaged in. A slot sized from an optimistic
// estimate overruns and delays every slot booked after it, so one clear sample of a straggler
// is believed at once; good news is averaged in at ewma_weight.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "sidecar/core/types.hpp"

namespace gradlane::sched {

enum class Direction : std::uint8_t { egress, ingress };

struct BandwidthConfig {
  // Assumed rate of a NIC never measured nor declared: 100 Gb/s (a common RoCE NIC). The
  // daemon should declare real line rates with set_rate(); this only matters until then.
  double default_bytes_per_sec = 12.5e9;
  // EWMA weight of a new sample (averaged as time per byte). 0.25 follows a step change within
  // ~8 samples while one odd sample moves the predicted transfer time by a quarter at most.
  double ewma_weight = 0.25;
  // Estimates never fall below this, so a broken sample cannot make transfer times explode.
  // 10 kB/s (80 kbit/s): below the 1-4 Mbit/s links the Soft-RoCE experiments shape, whose
  // estimates a higher floor would overstate (slots too short, every later slot overrun).
  double min_bytes_per_sec = 1e4;
  // A new estimate is published once the EWMA drifts more than 1% from the published one.
  double republish_fraction = 0.01;
  // A sample this many times slower than the estimate replaces it outright.
  double gross_error = 2.0;
  // Rates known before any transfer (gradlaned --link-rate): the NICs' line rates, or a link an
  // operator knows to be narrower. Learned from like any estimate afterwards.
  struct Declared {
    EndpointId endpoint{};
    Direction direction = Direction::egress;
    double bytes_per_sec = 0;
  };
  std::vector<Declared> declared;
};

class BandwidthEstimator {
 public:
  explicit BandwidthEstimator(BandwidthConfig config = {}) : config_(config) {}

  // Declares a rate (e.g. the NIC's line rate, or a configured cap). Replaces the estimate.
  void set_rate(EndpointId endpoint, Direction direction, double bytes_per_sec);
  // One sample for one side (e.g. from NIC counters). Ignored if duration <= 0 or bytes == 0.
  void observe(EndpointId endpoint, Direction direction, Bytes bytes, Nanos duration);
  // One completed transfer sender -> receiver; attributed as described above. sender_copies:
  // how many copies of the bytes the sender sent meanwhile (2 when it mirrored the update to
  // the server's replica): its egress carried that many times what the receiver got.
  void observe_transfer(EndpointId sender, EndpointId receiver, Bytes bytes, Nanos duration,
                        unsigned sender_copies = 1);

  double rate(EndpointId endpoint, Direction direction) const;
  // The side's line rate: the rate declared for it (set_rate), which no transfer lowers, else
  // its estimate. A share of a packed server's ingress is a rate over this: a fast write that
  // came in slow (contention, a busy CPU) lowers the server's estimate, and with it as the line
  // a sender that fits beside a straggler would take the whole server and wait for it.
  double line_rate(EndpointId endpoint, Direction direction) const;
  // Rate of the path sender -> receiver: its bottleneck.
  double path_rate(EndpointId sender, EndpointId receiver) const;
  // Predicted time to move `bytes` over that path, rounded up to whole nanoseconds, with the
  // sender sending `sender_copies` copies meanwhile (see mirrored_transfer_time).
  Nanos transfer_time(EndpointId sender, EndpointId receiver, Bytes bytes, unsigned sender_copies = 1) const;

  // Changes whenever any estimate changes, so callers can cache derived transfer times.
  std::uint64_t generation() const noexcept { return generation_; }
  const BandwidthConfig& config() const noexcept { return config_; }

 private:
  struct Estimate {
    double ewma;          // follows every sample
    double published;     // what rate() reports
    double carried = 0;   // the fastest rate recently carried (decays with each sample)
    bool known = false;   // declared or measured at least once (else: the default rate)
    double declared = 0;  // set_rate's rate (0: none)
  };
  struct Link {
    Estimate egress;
    Estimate ingress;
  };
  Link& link(EndpointId endpoint);
  Estimate& side(EndpointId endpoint, Direction direction);
  const Estimate* find(EndpointId endpoint, Direction direction) const;  // null: never seen
  void blend(Estimate& estimate, double sample);
  void lower(Estimate& estimate, double sample);

  BandwidthConfig config_;
  std::unordered_map<EndpointId, Link> links_;
  std::uint64_t generation_ = 0;
};

// bytes at bytes_per_sec, rounded up to whole nanoseconds (never zero for bytes > 0).
Nanos transfer_time(Bytes bytes, double bytes_per_sec) noexcept;

// A write of `bytes` that its sender also mirrors (sender_copies = 2: to the server and to its
// replica at once): the sender's egress carries sender_copies x bytes, the receiver's ingress
// bytes; the slower of the two is the transfer's time. With one copy this is
// transfer_time(bytes, min(egress, ingress)).
Nanos mirrored_transfer_time(Bytes bytes, unsigned sender_copies, double egress_bytes_per_sec,
                             double ingress_bytes_per_sec) noexcept;

}  // namespace gradlane::sched
