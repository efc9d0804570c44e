// gradlane — RDMA devices.
//
// A Device is one opened RDMA device port plus its protection domain: everything registered
// through it and every connection made from it share that PD. Select it by name (`rxe0`,
// `mlx5_0`) and, for RoCE, by GID index — chosen automatically (the first RoCE v2 GID that
// carries an IPv4 address) unless overridden, like perftest's `-x`. The GID's IPv4 address
// becomes the source address of every rdma_cm connection from this device, so several
// devices on one machine each use their own link.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct ibv_context;
struct ibv_pd;

namespace gradlane {

struct DeviceSelector {
  std::string name;     // e.g. "rxe0"; empty = the only device (error if several)
  int gid_index = -1;   // -1 = automatic (GRADLANE_GID_INDEX overrides in from_env)
  std::uint8_t port = 1;
};

struct DeviceInfo {
  std::string name;
  std::uint8_t port = 1;
  std::string link_layer;   // "Ethernet" (RoCE) or "InfiniBand"
  std::string port_state;   // "ACTIVE", "DOWN", ...
  std::uint32_t active_mtu = 0;   // bytes
  int gid_index = -1;
  std::string gid;          // "0000:0000:0000:0000:0000:ffff:c612:0001"
  std::string gid_type;     // "RoCE v2", "RoCE v1", "IB"
  std::string ipv4_address; // from an IPv4-mapped GID; empty for IB
  std::uint32_t max_qp_wr = 0;
  std::uint64_t max_mr_size = 0;
  int max_rd_atomic = 1;    // RDMA READs a QP may have outstanding (device limit, capped at 16)
};

class Device {
 public:
  // Opens the device and allocates its protection domain. Calls ibv_fork_init() first so a
  // later fork() cannot corrupt registered memory. Throws Error(device_not_found) listing
  // the devices that exist, Error(port_not_active) or Error(no_usable_gid) with what to check.
  static Device open(const DeviceSelector& selector);
  // Names of the RDMA devices present, as rdma_cm sees them.
  static std::vector<std::string> list();

  const DeviceInfo& info() const;
  ibv_context* context() const;
  ibv_pd* pd() const;

  // A Device is a cheap shared handle: copies share the opened device, and the connections
  // and memory regions made from it keep a copy, so the PD outlives everything that uses it.

 private:
  struct State;
  explicit Device(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

}  // namespace gradlane
