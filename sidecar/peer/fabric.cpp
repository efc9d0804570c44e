#include "sidecar/peer/fabric.hpp"

#include <fmt/format.h>

#include <chrono>

#include "gradlane/device.hpp"
#include "sidecar/peer/distributed_policy.hpp"
#include "sidecar/peer/rdma_peer_transport.hpp"

namespace gradlane::peer {
namespace {

// A host without peers: every receiver is local.
class NoPeers final : public PeerTransport {
 public:
  std::size_t peer_count() const override { return 0; }
  bool send(PeerIndex, std::span<const std::byte>) override { return false; }
  std::optional<std::pair<PeerIndex, std::vector<std::byte>>> receive() override { return std::nullopt; }
  std::vector<PeerIndex> take_failed() override { return {}; }
  std::string describe(PeerIndex) const override { return "none"; }
};

}  // namespace

struct Fabric::Links {
  std::optional<Device> device;
  std::unique_ptr<PeerTransport> transport;
};

Fabric::Fabric(const FabricOptions& options, std::function<void(const std::string&)> log)
    : options_(options), log_(std::move(log)), links_(std::make_unique<Links>()) {
  const bool has_peers = !options.peers.empty() || options.expect_peers > 0;
  if (has_peers) {
    if (options.device.empty()) {
      throw Error(Errc::invalid_argument, "--peer/--expect-peers need --device: the RDMA NIC the peer links use");
    }
    if (options.endpoints.empty()) {
      throw Error(Errc::invalid_argument, "--peer/--expect-peers need --endpoint: the endpoint ids this host serves");
    }
    DeviceSelector selector;
    selector.name = options.device;
    links_->device.emplace(Device::open(selector));
    std::vector<PeerAddress> addresses;
    for (const auto& p : options.peers) addresses.push_back(parse_peer_address(p));
    log_(fmt::format("linking with {} peer sidecar(s) from {} ({}:{})", addresses.size() + options.expect_peers,
                     options.device, links_->device->info().ipv4_address, options.listen_port));
    links_->transport =
        std::make_unique<RdmaPeerTransport>(*links_->device, options.listen_port, addresses, options.expect_peers,
                                            options.connect_timeout, options.transport);
  } else {
    links_->transport = std::make_unique<NoPeers>();
  }
  if (!options.schedule_log.empty()) schedule_log_.emplace(options.schedule_log);
}

Fabric::~Fabric() = default;

std::unique_ptr<sched::Policy> Fabric::make_policy(sched::SchedulerConfig config) {
  if (options_.link_rate_gbps > 0) config.bandwidth.default_bytes_per_sec = options_.link_rate_gbps * 1e9 / 8;
  auto policy = std::make_unique<DistributedPolicy>(config, options_.endpoints, *links_->transport, log_);
  policy->limit_peer_bytes(options_.peer_request_bytes, options_.peer_pending_bytes);
  if (schedule_log_) {
    policy->on_decision([this](const sched::Outcome& outcome, sched::Instant now, std::string_view origin) {
      schedule_log_->decision(outcome, now, origin);
    });
    policy->on_completion([this](sched::TransferId transfer, const sched::TransferView& granted, sched::Instant now,
                                 sched::Nanos measured, sched::TransferResult result) {
      schedule_log_->completion(transfer, granted, now, measured, result);
    });
    policy->on_request(
        [this](const sched::Request& request, sched::Instant now) { schedule_log_->request(request, now); });
    // The daemon's clock: CLOCK_MONOTONIC, as steady_clock is on Linux.
    policy->on_applied([this](sched::EndpointId receiver, sched::Seq through) {
      schedule_log_->applied(receiver, through, sched::Instant{std::chrono::steady_clock::now().time_since_epoch()});
    });
  }
  policy->start();
  // Until a peer's Hello arrives, its receivers would look local: wait for every Hello before
  // the daemon serves a single request.
  const auto deadline = std::chrono::steady_clock::now() + options_.connect_timeout;
  std::vector<sched::Outcome> none;
  while (!policy->ready()) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(Errc::timeout, "peer sidecars connected but did not introduce themselves in time");
    }
    policy->schedule(sched::Instant{std::chrono::steady_clock::now().time_since_epoch()}, none);
  }
  return policy;
}

std::optional<std::string> Fabric::reopen_schedule_log() {
  return schedule_log_ ? schedule_log_->reopen() : std::nullopt;
}

}  // namespace gradlane::peer
