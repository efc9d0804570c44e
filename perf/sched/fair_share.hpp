// Max-min fair sharing of links among flows, by progressive filling (water-filling).
//
// Every flow crosses a set of links, each with a capacity. All flows' rates rise together from
// zero; a link that fills up freezes the flows crossing it at the level reached; the others go
// on rising until every flow is frozen. The result is the max-min fair allocation: no flow can
// get more without taking from a flow that has no more than it. It is what many senders
// writing into one NIC at once get from its arbitration, and a flow held back by its own slow
// link leaves the rest of a shared link to the others (unlike an equal split).
//
// Used by the cluster simulator (cluster.hpp) with two links per transfer, sender egress and
// receiver ingress, but nothing here assumes that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gradlane::sched::sim {

class FairShare {
 public:
  // Forgets every link and flow; keeps the buffers, so one instance can be refilled cheaply.
  void clear();
  // Returns the link's index. Throws std::invalid_argument on a negative or non-finite capacity.
  std::uint32_t add_link(double capacity);
  // Returns the flow's index. Each flow crosses at least one link, each at most once; throws
  // std::invalid_argument otherwise (an unknown index, a repeat, no link).
  std::uint32_t add_flow(std::span<const std::uint32_t> links);

  std::size_t links() const { return capacity_.size(); }
  std::size_t flows() const { return flow_begin_.size() - 1; }
  double capacity(std::uint32_t link) const { return capacity_[link]; }
  std::span<const std::uint32_t> links_of(std::uint32_t flow) const;

  // The max-min fair rate of every flow, indexed by flow. O((links + crossings) log links).
  const std::vector<double>& solve();

 private:
  std::vector<double> capacity_;
  std::vector<std::uint32_t> flow_links_;   // every flow's links, one after another
  std::vector<std::size_t> flow_begin_{0};  // flow f: flow_links_[begin[f], begin[f+1])
  // Scratch for solve(), kept between calls.
  std::vector<double> rate_;
  std::vector<double> remaining_;        // capacity minus the frozen flows' rates
  std::vector<std::uint32_t> unfrozen_;  // flows still rising, per link
  std::vector<std::size_t> link_begin_;  // the flows crossing each link (CSR)
  std::vector<std::uint32_t> link_flows_;
  std::vector<bool> frozen_;
};

}  // namespace gradlane::sched::sim
