#include "sidecar/core/bandwidth.hpp"

#include <algorithm>
#include <cmath>

namespace gradlane::sched {

Nanos transfer_time(Bytes bytes, double bytes_per_sec) noexcept {
  if (bytes == 0) return Nanos::zero();
  const double ns = std::ceil(static_cast<double>(bytes) * 1e9 / bytes_per_sec);
  return Nanos{std::max<std::int64_t>(1, static_cast<std::int64_t>(ns))};
}

BandwidthEstimator::Link& BandwidthEstimator::link(EndpointId endpoint) {
  const Estimate d{config_.default_bytes_per_sec, config_.default_bytes_per_sec};
  return links_.try_emplace(endpoint, Link{d, d}).first->second;
}

BandwidthEstimator::Estimate& BandwidthEstimator::side(EndpointId endpoint, Direction direction) {
  Link& l = link(endpoint);
  return direction == Direction::egress ? l.egress : l.ingress;
}

void BandwidthEstimator::blend(Estimate& estimate, double sample) {
  const double a = config_.ewma_weight;
  estimate.ewma = std::max(config_.min_bytes_per_sec, (1.0 - a) * estimate.ewma + a * sample);
  if (std::abs(estimate.ewma - estimate.published) >
      config_.republish_fraction * estimate.published) {
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
  side(endpoint, direction) = Estimate{rate, rate, rate};
  ++generation_;
}

void BandwidthEstimator::observe(EndpointId endpoint, Direction direction, Bytes bytes,
                                 Nanos duration) {
  if (bytes == 0 || duration <= Nanos::zero()) return;
  Estimate& e = side(endpoint, direction);
  const double x = static_cast<double>(bytes) * 1e9 / static_cast<double>(duration.count());
  if (x < e.ewma) {
    lower(e, x);
  } else {
    blend(e, x);
  }
}

void BandwidthEstimator::observe_transfer(EndpointId sender, EndpointId receiver, Bytes bytes,
                                          Nanos duration) {
  if (bytes == 0 || duration <= Nanos::zero()) return;
  const double x = static_cast<double>(bytes) * 1e9 / static_cast<double>(duration.count());
  Estimate& out = side(sender, Direction::egress);
  Estimate& in = side(receiver, Direction::ingress);  // distinct: sender != receiver sides
  const double out_before = out.ewma;
  const double in_before = in.ewma;
  // Recorded after the decision below, so this sample is not its own evidence. 0.95: a rate
  // carried fades to half in ~14 samples through that side.
  constexpr double kCarriedDecay = 0.95;
  const auto remember = [&] {
    out.carried = std::max(x, out.carried * kCarriedDecay);
    in.carried = std::max(x, in.carried * kCarriedDecay);
  };
  if (x >= std::min(out_before, in_before)) {
    // Evidence that both sides carry at least x: raise whichever is below it.
    if (out_before < x) blend(out, x);
    if (in_before < x) blend(in, x);
    remember();
    return;
  }
  // Slower than both estimates. A side that recently carried clearly more is not the
  // bottleneck; otherwise blame the believed bottleneck, the sender on a tie.
  constexpr double kClearlyMore = 1.5;
  constexpr double kTie = 1.05;
  const bool out_cleared = out.carried >= x * kClearlyMore;
  const bool in_cleared = in.carried >= x * kClearlyMore;
  if (in_cleared != out_cleared) {
    lower(in_cleared ? out : in, x);
  } else if (out_before <= in_before * kTie) {
    lower(out, x);
  } else {
    lower(in, x);
  }
  remember();
}

double BandwidthEstimator::rate(EndpointId endpoint, Direction direction) const {
  const auto it = links_.find(endpoint);
  if (it == links_.end()) return config_.default_bytes_per_sec;
  return direction == Direction::egress ? it->second.egress.published
                                        : it->second.ingress.published;
}

double BandwidthEstimator::path_rate(EndpointId sender, EndpointId receiver) const {
  return std::min(rate(sender, Direction::egress), rate(receiver, Direction::ingress));
}

Nanos BandwidthEstimator::transfer_time(EndpointId sender, EndpointId receiver, Bytes bytes) const {
  return sched::transfer_time(bytes, path_rate(sender, receiver));
}

}  // namespace gradlane::sched
