// Fabric: what gradlaned needs to schedule across hosts — its RDMA device, the links to its
// peer sidecars, the distributed policy on top of them, and the schedule log. Without peers it
// is the plain scheduling core for the receivers on this host's --endpoint list (for every
// receiver when there is no list), so gradlaned has one code path.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradlane/options.hpp"
#include "sidecar/core/config.hpp"
#include "sidecar/core/policy.hpp"
#include "sidecar/peer/distributed_policy.hpp"
#include "sidecar/peer/peer_transport.hpp"
#include "sidecar/peer/schedule_log.hpp"

namespace gradlane::peer {

struct FabricOptions {
  std::string device;                                 // --device: the NIC peer links use (needed with peers)
  std::vector<std::uint32_t> endpoints;               // --endpoint: scheduler endpoint ids of this host's NICs
  std::uint16_t listen_port = 0;                      // --listen-port: where peer sidecars connect
  std::vector<std::string> peers;                     // --peer ADDR:PORT: sidecars this one connects to
  std::size_t expect_peers = 0;                       // --expect-peers: sidecars that connect to this one
  double link_rate_gbps = 0;                          // --link-rate-gbps: declared NIC rate (0: core default)
  std::chrono::milliseconds connect_timeout{60'000};  // all peer links up within this
  std::string schedule_log;                           // --schedule-log FILE ("-" = stderr; empty = none)
  TransportOptions transport;                         // the peer links' (their job key: --key-file)
  // What a peer may ask this sidecar to hold: one request, and its pending requests together
  // (gradlaned: what it lets an app request, --max-update-bytes, and what its apps may owe
  // together, --max-apps x --max-owed-bytes, so a peer configured alike is never refused).
  std::uint64_t peer_request_bytes = kMaxPeerRequestBytes;
  std::uint64_t peer_pending_bytes = kMaxPendingBytesPerPeer;
};

class Fabric {
 public:
  // Opens the device and makes every peer link (bounded by connect_timeout). Throws Error.
  explicit Fabric(const FabricOptions& options, std::function<void(const std::string&)> log);
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;
  ~Fabric();

  // The policy for the daemon. The Fabric must outlive it (the policy uses its links).
  std::unique_ptr<sched::Policy> make_policy(sched::SchedulerConfig config);
  // SIGHUP: the schedule log is opened again (appending). A message if that failed.
  std::optional<std::string> reopen_schedule_log();

 private:
  struct Links;
  FabricOptions options_;
  std::function<void(const std::string&)> log_;
  std::unique_ptr<Links> links_;
  std::optional<sidecar::ScheduleLog> schedule_log_;
};

}  // namespace gradlane::peer
