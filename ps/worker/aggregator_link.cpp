#include "ps/worker/aggregator_link.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common/back_off.hpp"
#include "ps/protocol/regions.hpp"

namespace gradlane::ps {
namespace {

using Clock = std::chrono::steady_clock;

// How long a worker tries to reach an aggregator the server announced.
constexpr Millis kReachAnnouncedWithin{5000};

}  // namespace

AggregatorLink::AggregatorLink(const Device& device, const WorkerOptions& options, std::size_t bytes, bool sidecar_mode)
    : device_(device),
      worker_(options.id),
      configured_(options.aggregator),
      transport_(options.transport),
      bytes_(bytes),
      sidecar_mode_(sidecar_mode) {}

void AggregatorLink::connect(Millis timeout) {
  conn_.emplace(connect_to(configured_->address, configured_->port, timeout));
}

// Connects to an aggregator, learns its ring, says who we are.
Connection AggregatorLink::connect_to(const std::string& address, std::uint16_t port, Millis timeout) {
  Connection conn = connect_with_retry(device_, address, port, transport_, timeout);
  const RegionDescriptor ring = conn.wait_region(kSlotRegionId, timeout);
  if (ring.length == 0 || ring.length % bytes_ != 0) {
    throw Error(Errc::protocol, fmt::format("{}: the aggregator's ring ({} bytes) is not whole slots of {} bytes: "
                                            "are worker and aggregator configured with the same shard?",
                                            conn.describe(), ring.length, bytes_));
  }
  conn.send(encode(Hello{PeerKind::worker, worker_}));
  ring_ = ring;
  said_bye_ = false;
  return conn;
}

void AggregatorLink::drop(const std::string& why) {
  std::fprintf(stderr,
               "gradlane ps worker %u: aggregator lost (%s); %zu update(s) it held reported not delivered; %s\n",
               worker_, why.c_str(), pending_.size(),
               sidecar_mode_ ? "updates redirected to it are reported lost" : "pushing to the server directly");
  for (const Pending& p : pending_) outcomes_.push_back({p.tag, p.member, 0, false});
  pending_.clear();
  conn_.reset();
}

void AggregatorLink::take_forwarded(const Forwarded& f) {
  const auto it =
      std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.member == f.member; });
  if (it == pending_.end()) {
    // Not ours (a stray or a rogue report, or one for a write this process never made):
    // nothing pending changes.
    std::fprintf(stderr,
                 "gradlane ps worker %u: the aggregator reported member %llu, which is not pending here: "
                 "ignored\n",
                 worker_, static_cast<unsigned long long>(f.member));
    return;
  }
  outcomes_.push_back({it->tag, it->member, f.sequence, f.delivered});
  pending_.erase(it);
}

void AggregatorLink::take_messages() {
  if (!conn_) return;
  try {
    while (auto said = conn_->try_receive()) {
      const Message message = decode(*said);
      const auto* forwarded = std::get_if<Forwarded>(&message);
      if (forwarded == nullptr) {
        throw Error(Errc::protocol, fmt::format("{}: unexpected message (kind {}) from the aggregator",
                                                conn_->describe(), message.index() + 1));
      }
      take_forwarded(*forwarded);
    }
  } catch (const Error& e) {
    drop(e.what());
  }
}

void AggregatorLink::heard_of(const ListeningAt& at) {
  if (!configured_ || found_again_) return;
  // Only ours (another aggregator of the job, restarted, is not this worker's to use).
  if (at.port != configured_->port || at.address != configured_->address) return;
  if (conn_) {
    // Ours restarted, but we have not seen the old one's disconnect yet (a sidecar-mode
    // worker reads its aggregator only to write to it): kept until we have, and the old
    // connection probed, so a dead peer fails it within the ACK timeout.
    announced_ = at;
    try {
      if (conn_->outstanding() == 0) conn_->probe();
    } catch (const Error& e) {
      drop(e.what());
    }
    if (conn_) return;
  }
  announced_.reset();
  try {
    found_again_.emplace(connect_to(at.address, at.port, kReachAnnouncedWithin));
    std::fprintf(stderr, "gradlane ps worker %u: pushing through the aggregator again from the next push, %s\n",
                 worker_, found_again_->describe().c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "gradlane ps worker %u: the aggregator at %s:%u is out of reach, pushing to the server: %s\n",
                 worker_, at.address.c_str(), at.port, e.what());
  }
}

void AggregatorLink::before_push() {
  if (!conn_ && announced_) heard_of(*announced_);
  if (found_again_ && !conn_) {
    conn_ = std::move(found_again_);
    found_again_.reset();
  }
}

std::vector<MemberOutcome> AggregatorLink::take_outcomes() { return std::exchange(outcomes_, {}); }

bool AggregatorLink::settle(Millis timeout) {
  const auto start = Clock::now();
  auto last_probe = start;
  if (conn_ && !said_bye_) {
    try {
      conn_->send(encode(Bye{worker_}));
      said_bye_ = true;
    } catch (const Error& e) {
      drop(e.what());
    }
  }
  for (;;) {
    take_messages();
    if (pending_.empty()) return true;
    const auto now = Clock::now();
    if (now - start > timeout) return false;
    // An aggregator gone without a disconnect reaching us: a probe a second finds it.
    if (now - last_probe >= std::chrono::seconds(1) && conn_->outstanding() == 0) {
      last_probe = now;
      try {
        conn_->probe();
      } catch (const Error& e) {
        drop(e.what());
      }
    }
    detail::back_off(now - start);
  }
}

std::vector<Connection*> AggregatorLink::to_tell_bye() {
  std::vector<Connection*> told;
  if (conn_ && !said_bye_) told.push_back(&*conn_);
  if (found_again_) told.push_back(&*found_again_);  // found again, never pushed through
  return told;
}

}  // namespace gradlane::ps
