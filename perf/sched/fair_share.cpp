#include "perf/sched/fair_share.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <stdexcept>
#include <tuple>

namespace gradlane::sched::sim {

void FairShare::clear() {
  capacity_.clear();
  flow_links_.clear();
  flow_begin_.assign(1, 0);
}

std::uint32_t FairShare::add_link(double capacity) {
  if (!(capacity >= 0) || !std::isfinite(capacity)) {
    throw std::invalid_argument("FairShare: a link's capacity must be finite and >= 0");
  }
  capacity_.push_back(capacity);
  return static_cast<std::uint32_t>(capacity_.size() - 1);
}

std::uint32_t FairShare::add_flow(std::span<const std::uint32_t> links) {
  if (links.empty()) throw std::invalid_argument("FairShare: a flow crosses at least one link");
  const std::size_t begin = flow_links_.size();
  for (const std::uint32_t link : links) {
    const auto mine = std::span(flow_links_).subspan(begin);
    if (link >= capacity_.size() || std::find(mine.begin(), mine.end(), link) != mine.end()) {
      flow_links_.resize(begin);
      throw std::invalid_argument("FairShare: a flow's link is unknown or repeated");
    }
    flow_links_.push_back(link);
  }
  flow_begin_.push_back(flow_links_.size());
  return static_cast<std::uint32_t>(flows() - 1);
}

std::span<const std::uint32_t> FairShare::links_of(std::uint32_t flow) const {
  return std::span(flow_links_).subspan(flow_begin_[flow], flow_begin_[flow + 1] - flow_begin_[flow]);
}

const std::vector<double>& FairShare::solve() {
  const std::size_t n_links = links(), n_flows = flows();
  rate_.assign(n_flows, 0.0);
  frozen_.assign(n_flows, false);
  remaining_.assign(capacity_.begin(), capacity_.end());
  unfrozen_.assign(n_links, 0);
  for (const std::uint32_t link : flow_links_) ++unfrozen_[link];
  link_begin_.assign(n_links + 1, 0);
  for (std::size_t l = 0; l < n_links; ++l) link_begin_[l + 1] = link_begin_[l] + unfrozen_[l];
  link_flows_.resize(flow_links_.size());
  {
    std::vector<std::size_t>& fill = link_begin_;  // reused as a cursor, restored below
    for (std::uint32_t f = 0; f < n_flows; ++f) {
      for (const std::uint32_t link : links_of(f)) link_flows_[fill[link]++] = f;
    }
    for (std::size_t l = n_links; l > 0; --l) fill[l] = fill[l - 1];
    fill[0] = 0;
  }

  // The level a link would fill at: its capacity left over by frozen flows, split evenly among
  // the flows still rising on it. The smallest one fills next. Freezing a flow at that level
  // only raises the level of its other links (their leftover shrinks by at most their own
  // level's share), so a heap with lazy deletion works: an entry whose unfrozen count is no
  // longer the link's is stale.
  using Entry = std::tuple<double, std::uint32_t, std::uint32_t>;  // level, link, unfrozen then
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> next;
  const auto level_of = [&](std::uint32_t l) { return std::max(0.0, remaining_[l]) / unfrozen_[l]; };
  for (std::uint32_t l = 0; l < n_links; ++l) {
    if (unfrozen_[l] > 0) next.emplace(level_of(l), l, unfrozen_[l]);
  }
  while (!next.empty()) {
    const auto [level, link, count] = next.top();
    next.pop();
    if (unfrozen_[link] != count || count == 0) continue;
    for (std::size_t i = link_begin_[link]; i < link_begin_[link + 1]; ++i) {
      const std::uint32_t f = link_flows_[i];
      if (frozen_[f]) continue;
      frozen_[f] = true;
      rate_[f] = level;
      for (const std::uint32_t other : links_of(f)) {
        remaining_[other] -= level;
        --unfrozen_[other];
        if (other != link && unfrozen_[other] > 0) next.emplace(level_of(other), other, unfrozen_[other]);
      }
    }
  }
  return rate_;
}

}  // namespace gradlane::sched::sim
