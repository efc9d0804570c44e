// The simulated cluster's wire (cluster.hpp): each NIC direction a link; under the fair model
// the transfers on a link share it max-min fairly (fair_share.hpp), re-shared whenever one
// starts or ends; under the exclusive model a transfer holds its slot at the slower end's rate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <variant>

#include "perf/sched/cluster.hpp"

namespace gradlane::sched::sim {

std::uint32_t Cluster::link_key_of_ingress(EndpointId receiver) const {
  const std::uint32_t id = to_int(receiver);
  return id >= kServerBase ? p_.workers + (id - kServerBase) : p_.workers + p_.servers + (id - 1);
}

double Cluster::link_capacity(std::uint32_t key) const {
  if (key < p_.workers) return worker_egress(key);
  if (key < p_.workers + p_.servers) return true_in_.at(server(key - p_.workers));
  if (key < 2 * p_.workers + p_.servers) return true_in_.at(worker(key - p_.workers - p_.servers));
  return p_.server_gbps * kGbps;  // a server's egress: its line rate, as its ingress
}

void Cluster::put_on_wire(std::uint64_t id, Instant now) {
  advance_wire(now);  // the bytes so far moved at the rates without this transfer
  const Transfer& t = transfers_.at(id);
  WireFlow f;
  f.transfer = id;
  // Workers send updates (aggregators are workers); servers send only pulls.
  f.egress_link = t.pull ? 2 * p_.workers + p_.servers + (to_int(t.out) - kServerBase) : to_int(t.out) - 1;
  f.ingress_link = link_key_of_ingress(t.in);
  f.pull = t.pull;
  if (t.to_server) {
    f.server = to_int(t.in) - kServerBase;
    if (server_flows_[*f.server]++ == 0) ++busy_servers_;
  }
  f.remaining = static_cast<double>(t.bytes);
  wire_.push_back(f);
  begins_[id] = now;
  wire_changed_ = true;
}

void Cluster::advance_wire(Instant now) {
  if (now <= wire_clock_) return;
  const double seconds = static_cast<double>((now - wire_clock_).count()) / 1e9;
  wire_clock_ = now;
  for (WireFlow& f : wire_) {
    // A flow never carries more than it has left (its end is rounded up to a whole ns).
    const double carried = std::min(f.rate * seconds, std::max(0.0, f.remaining));
    f.remaining -= carried;
    if (f.server) server_bytes_carried_ += carried;
    if (f.pull) server_bytes_sent_ += carried;
  }
  stats_.server_busy_ms += busy_servers_ * seconds * 1e3;
}

void Cluster::reshare(Instant now) {
  wire_changed_ = false;
  ++wire_generation_;  // whatever wire_done is queued was computed on the old rates
  fair_share_.clear();
  for (const std::uint32_t key : used_links_) link_index_[key] = -1;
  used_links_.clear();
  const auto index_of = [&](std::uint32_t key) {
    if (link_index_[key] < 0) {
      link_index_[key] = fair_share_.add_link(link_capacity(key));
      used_links_.push_back(key);
    }
    return static_cast<std::uint32_t>(link_index_[key]);
  };
  for (const WireFlow& f : wire_) {
    const std::uint32_t links[] = {index_of(f.egress_link), index_of(f.ingress_link)};
    fair_share_.add_flow(links);
  }
  const std::vector<double>& rates = fair_share_.solve();
  std::optional<double> first_end_ns;
  for (std::size_t i = 0; i < wire_.size(); ++i) {
    wire_[i].rate = rates[i];
    if (rates[i] <= 0) continue;
    const double end_ns = std::max(0.0, wire_[i].remaining) / rates[i] * 1e9;
    if (!first_end_ns || end_ns < *first_end_ns) first_end_ns = end_ns;
  }
  // Rounded up, and at least 1 ns: when it fires, that transfer has no bytes left.
  if (first_end_ns) {
    const auto ns = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(*first_end_ns)));
    push(now + Nanos{ns}, Kind::wire_done, wire_generation_);
  }
}

void Cluster::finish_due_flows(Instant now) {
  advance_wire(now);
  wire_changed_ = true;  // even if rounding left every flow a hair short: reshare reschedules
  std::vector<std::uint64_t> done;
  std::erase_if(wire_, [&](const WireFlow& f) {
    // What is left would cross within the nanosecond this event was rounded to (or rounding).
    if (f.remaining > f.rate * 1e-9 + 1e-6) return false;
    if (f.server && --server_flows_[*f.server] == 0) --busy_servers_;
    done.push_back(f.transfer);
    return true;
  });
  for (const std::uint64_t id : done) finish_transfer(id, now);
}

void Cluster::start_exclusive(std::uint64_t id, Transfer t, Instant slot_start, Instant now) {
  Instant& out_free = busy_out_[t.out];
  Instant& in_free = busy_in_[t.in];
  const Instant begin = std::max({slot_start, now, out_free, in_free});
  const std::uint32_t sender = to_int(t.out) - 1;  // only workers send (aggregators are workers)
  const double rate = std::min(worker_egress(sender), true_in_.at(t.in));
  const Nanos length{static_cast<std::int64_t>(static_cast<double>(t.bytes) * 1e9 / rate) + 1};
  out_free = in_free = begin + length;
  if (t.to_server) {
    stats_.server_busy_ms += static_cast<double>(length.count()) / 1e6;
    stats_.server_ingress_bytes += t.bytes;
  }
  begins_[id] = begin;
  transfers_.emplace(id, std::move(t));
  push(begin + length, Kind::transfer_done, id);
}

}  // namespace gradlane::sched::sim
