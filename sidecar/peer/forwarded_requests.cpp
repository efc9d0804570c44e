#include "sidecar/peer/forwarded_requests.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "gradlane/error.hpp"
#include "sidecar/core/partition.hpp"

namespace gradlane::peer {

void ForwardedRequests::add(std::uint64_t id, PeerIndex peer, const sched::Request& request) {
  requests_[id] = Forwarded{peer, request, 0, 0, 0, {}};
}

void ForwardedRequests::check_fits(const Forwarded& f, const SlotAnswer& m) {
  const sched::Request& r = f.request;
  if (!f.decided.empty() && m.part_count != f.parts) {
    throw Error(Errc::protocol, fmt::format("answer for request {} splits it into {} parts, an earlier answer into {}",
                                            m.request, m.part_count, f.parts));
  }
  if (const auto most = std::min<sched::Bytes>(r.bytes, sched::Partitioner::kMaxParts); m.part_count > most) {
    throw Error(Errc::protocol, fmt::format("answer for request {} splits its {} bytes into {} parts (at most {})",
                                            m.request, r.bytes, m.part_count, most));
  }
  if (m.length > r.bytes || m.offset > r.bytes - m.length) {
    throw Error(Errc::protocol, fmt::format("answer for request {} names bytes [{}, +{}) of its {}", m.request,
                                            m.offset, m.length, r.bytes));
  }
  if (!f.decided.empty() && f.decided[m.part]) {
    throw Error(Errc::protocol, fmt::format("a second answer for part {} of request {}", m.part, m.request));
  }
}

sched::Request ForwardedRequests::decide(PeerIndex peer, const SlotAnswer& m) {
  const auto it = requests_.find(m.request);
  if (it == requests_.end() || it->second.peer != peer) {
    throw Error(Errc::protocol, fmt::format("answer for request {}, which was not forwarded to this peer", m.request));
  }
  Forwarded& f = it->second;
  check_fits(f, m);
  if (f.decided.empty()) {
    f.parts = m.part_count;
    f.decided.resize(m.part_count);
  }
  f.decided[m.part] = true;  // check_fits: part < parts == decided.size()
  // The peer's split is its partitioner's: every part but the last has the same length.
  if (m.part + 1 < m.part_count) {
    f.chunk = m.length;
  } else if (m.part > 0) {
    f.chunk = m.offset / m.part;
  }
  sched::Request request = f.request;
  if (++f.answered >= f.parts) requests_.erase(it);
  return request;
}

void ForwardedRequests::drop_undecided(PeerIndex peer, std::vector<sched::Outcome>& out) {
  for (auto it = requests_.begin(); it != requests_.end();) {
    const Forwarded& f = it->second;
    if (f.peer != peer) {
      ++it;
      continue;
    }
    const sched::Request& r = f.request;
    const auto drop = [&](std::uint32_t part, std::uint32_t parts, std::uint64_t offset, std::uint64_t length) {
      out.push_back(
          sched::Drop{r.id, part, parts, offset, length, r.job, r.sender, r.receiver, sched::DropReason::peer_lost, 0});
    };
    if (f.parts == 0) {
      drop(0, 1, 0, r.bytes);
    } else {
      for (std::uint32_t part = 0; part < f.parts; ++part) {
        if (f.decided[part]) continue;
        const std::uint64_t offset = std::min<std::uint64_t>(std::uint64_t{part} * f.chunk, r.bytes);
        drop(part, f.parts, offset, std::min(f.chunk, r.bytes - offset));
      }
    }
    it = requests_.erase(it);
  }
}

}  // namespace gradlane::peer
