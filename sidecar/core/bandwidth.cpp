#include "sidecar/core/bandwidth.hpp"

#include <algorithm>
#include <cmath>

namespace gradlane::sched {

Nanos transfer_time(Bytes bytes, double bytes_per_sec) noexcept {
  if (bytes == 0) return Nanos::zero();
  const double ns = std::ceil(static_cast<double>(bytes) * 1e9 / bytes_per_sec);
  return Nanos{std::max<std::int64_t>(1, static_cast<std::int64_t>(ns))};
}

Nanos mirrored_transfer_time(Bytes bytes, unsigned sender_copies, double egress_bytes_per_sec,
                             double ingress_bytes_per_sec) noexcept {
  return std::max(transfer_time(bytes * std::max(1U, sender_copies), egress_bytes_per_sec),
                  transfer_time(bytes, ingress_bytes_per_sec));
}

BandwidthEstimator::Link& BandwidthEstimator::link(EndpointId endpoint) {
  const Estimate d{config_.default_bytes_per_sec, config_.default_bytes_per_sec};
  return links_.try_emplace(endpoint, Link{d, d}).first->second;
}

BandwidthEstimator::Estimate& BandwidthEstimator::side(EndpointId endpoint, Direction direction) {
  Link& l = link(endpoint);
  return direction == Direction::egress ? l.egress : l.ingress;
}

// The average is taken over seconds per byte (a weighted harmonic mean of the rates): what the
// scheduler predicts is a transfer's time, and averaging rates would let one fast sample undo
// many slow ones. A shaped link with a burst allowance (tc tbf) passes an update now and then
// at line rate; averaged as rates, one such sample raised a 1 Mbit/s straggler's estimate ~20x,
// its next slot was sized 20x too short and overran the server's following slots.
void BandwidthEstimator::blend(Estimate& estimate, double sample) {
  const double a = config_.ewma_weight;
  const double seconds_per_byte = (1.0 - a) / estimate.ewma + a / sample;
  estimate.ewma = std::max(config_.min_bytes_per_sec, 1.0 / seconds_per_byte);
  if (std::abs(estimate.ewma - estimate.published) > config_.republish_fraction * estimate.published) {
    estimate.published = estimate.ewma;
    ++generation_;
  }
}

void BandwidthEstimator::lower(Estimate& estimate, double sample) {
  if (sample * config_.gross_error < estimate.ewma) {
    estimate.ewma = std::max(config_.min_bytes_per_sec, sample);
    estimate.published = estimate.ewma;
    ++generation_;
    return;
  }
  blend(estimate, sample);
}

void BandwidthEstimator::set_rate(EndpointId endpoint, Direction direction, double bytes_per_sec) {
  const double rate = std::max(config_.min_bytes_per_sec, bytes_per_sec);
  side(endpoint, direction) = Estimate{rate, rate, rate, true, rate};
  ++generation_;
}

void BandwidthEstimator::observe(EndpointId endpoint, Direction direction, Bytes bytes, Nanos duration) {
  if (bytes == 0 || duration <= Nanos::zero()) return;
  Estimate& e = side(endpoint, direction);
  e.known = true;
  const double x = static_cast<double>(bytes) * 1e9 / static_cast<double>(duration.count());
  if (x < e.ewma) {
    lower(e, x);
  } else {
    blend(e, x);
  }
}

void BandwidthEstimator::observe_transfer(EndpointId sender, EndpointId receiver, Bytes bytes, Nanos duration,
                                          unsigned sender_copies) {
  if (bytes == 0 || duration <= Nanos::zero()) return;
  // Each side's sample: what it carried over the transfer's duration.
  const double x_in = static_cast<double>(bytes) * 1e9 / static_cast<double>(duration.count());
  const double x_out = x_in * std::max(1U, sender_copies);
  Estimate& out = side(sender, Direction::egress);
  Estimate& in = side(receiver, Direction::ingress);  // distinct: sender != receiver sides
  const double out_before = out.ewma;
  const double in_before = in.ewma;
  const bool out_known = out.known;
  const bool in_known = in.known;
  out.known = in.known = true;
  // Recorded after the decision below, so this sample is not its own evidence. 0.95: a rate
  // carried fades to half in ~14 samples through that side.
  constexpr double kCarriedDecay = 0.95;
  const auto remember = [&] {
    out.carried = std::max(x_out, out.carried * kCarriedDecay);
    in.carried = std::max(x_in, in.carried * kCarriedDecay);
  };
  if (x_out >= out_before || x_in >= in_before) {
    // Evidence that both sides carry at least their sample: raise whichever is below it.
    if (out_before < x_out) blend(out, x_out);
    if (in_before < x_in) blend(in, x_in);
    remember();
    return;
  }
  // Slower than both estimates. Against a side never measured nor declared, a side that
  // recently carried clearly more is not the bottleneck; otherwise blame the believed
  // bottleneck (the side whose estimate is the lower multiple of its sample), the sender on a
  // tie. Only against an unknown side: between two known sides what each carried is not
  // comparable evidence (a sender with a few transfers still remembers a rate from before its
  // link slowed, a busy server only its last few ms), and the simulator's server ingress,
  // blamed for workers' slowdowns, fell far below its rate (time to 80 % 2.7 s -> not reached).
  constexpr double kClearlyMore = 1.5;
  constexpr double kTie = 1.05;
  const bool out_cleared = !in_known && out.carried >= x_out * kClearlyMore;
  const bool in_cleared = !out_known && in.carried >= x_in * kClearlyMore;
  if (in_cleared != out_cleared) {
    if (in_cleared) {
      lower(out, x_out);
    } else {
      lower(in, x_in);
    }
  } else if (out_before / x_out <= in_before / x_in * kTie) {
    lower(out, x_out);
  } else {
    lower(in, x_in);
  }
  remember();
}

const BandwidthEstimator::Estimate* BandwidthEstimator::find(EndpointId endpoint, Direction direction) const {
  const auto it = links_.find(endpoint);
  if (it == links_.end()) return nullptr;
  return direction == Direction::egress ? &it->second.egress : &it->second.ingress;
}

double BandwidthEstimator::rate(EndpointId endpoint, Direction direction) const {
  const Estimate* e = find(endpoint, direction);
  return e == nullptr ? config_.default_bytes_per_sec : e->published;
}

double BandwidthEstimator::line_rate(EndpointId endpoint, Direction direction) const {
  const Estimate* e = find(endpoint, direction);
  if (e == nullptr) return config_.default_bytes_per_sec;
  return e->declared > 0 ? e->declared : e->published;
}

double BandwidthEstimator::path_rate(EndpointId sender, EndpointId receiver) const {
  return std::min(rate(sender, Direction::egress), rate(receiver, Direction::ingress));
}

Nanos BandwidthEstimator::transfer_time(EndpointId sender, EndpointId receiver, Bytes bytes,
                                        unsigned sender_copies) const {
  return mirrored_transfer_time(bytes, sender_copies, rate(sender, Direction::egress),
                                rate(receiver, Direction::ingress));
}

}  // namespace gradlane::sched
