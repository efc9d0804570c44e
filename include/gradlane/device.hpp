// gradlane — RDMA devices.
//
// A Device is one opened RDMA device port plus its protection domain: everything registered
// through it and every connection made from it share that PD. Select it by name (`rxe0`,
// `mlx5_0`) and, for RoCE, by GID index: the selector's, else GRADLANE_GID_INDEX's, else
// chosen automatically (the first RoCE v2 GID that carries an IPv4 address) — like perftest's
// `-x`. The GID's IPv4 address
// becomes the source address of every rdma_cm connection from this device, so several
// devices on one machine each use their own link.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct ibv_context;
struct ibv_pd;

namespace gradlane {

struct DeviceSelector {
  std::string name;    // e.g. "rxe0"; empty = the only device (error if several)
  int gid_index = -1;  // -1 = GRADLANE_GID_INDEX when set, else automatic (see Device::open)
  std::uint8_t port = 1;

  // A selector from GRADLANE_DEVICE (the name) and GRADLANE_GID_INDEX, read through `getenv`
  // (injectable for tests; default: the process environment). Unset variables leave the
  // defaults; a malformed GRADLANE_GID_INDEX throws Error(invalid_argument) naming it.
  static DeviceSelector from_env(const std::function<std::optional<std::string>(const char*)>& getenv = {});
};

struct DeviceInfo {
  std::string name;
  std::uint8_t port = 1;
  std::string link_layer;        // "Ethernet" (RoCE) or "InfiniBand"
  std::string port_state;        // "ACTIVE", "DOWN", ...
  std::uint32_t active_mtu = 0;  // bytes
  int gid_index = -1;
  std::string gid;           // "0000:0000:0000:0000:0000:ffff:c612:0001"
  std::string gid_type;      // "RoCE v2", "RoCE v1", "IB"
  std::string ipv4_address;  // from an IPv4-mapped GID; empty for IB
  std::uint32_t max_qp_wr = 0;
  std::uint64_t max_mr_size = 0;
  // Largest message one work request may carry on this port (max_msg_sz; ≤ 2^31 on IB/RoCE).
  // Longer writes/reads are refused before posting, never cut.
  std::uint64_t max_message_bytes = 0;
  int max_rd_atomic = 1;  // RDMA READs a QP may have outstanding (device limit, capped at 16)
  // Type-2 memory windows (device_cap_flags MEM_WINDOW_TYPE_2A or _2B): a window bound per
  // grant over one slot, usable only by the QP that bound it (see MemoryWindow). rdma_rxe has
  // them; without them the NIC enforces only whole-region bounds and access.
  bool memory_windows = false;
  std::uint32_t max_memory_windows = 0;  // max_mw
  // Whether the device confines an access through a window to the window's own range. False
  // for rdma_rxe (measured on Linux 6.1: its responder checks the range of the region under
  // the window, so a write past the window's end but inside the region lands). There a window
  // confines a peer to a slot only when the slot is a region of its own
  // (MemoryRegion::register_slice) and the window covers all of it.
  bool window_bounds_checked = false;
  std::uint32_t vendor_id = 0;
};

class Device {
 public:
  // Opens the device and allocates its protection domain. A selector without a GID index
  // (-1) takes GRADLANE_GID_INDEX from the environment when it is set (malformed: Error
  // invalid_argument naming it), so the connect errors' advice to set it works for every
  // program, not only the tools. Calls ibv_fork_init() first so a
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
