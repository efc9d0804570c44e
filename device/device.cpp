// Device discovery and selection: by name, port, and GID index (automatic for RoCE v2).
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>

#include "common/syscall_error.hpp"
#include "gradlane/device.hpp"
#include "gradlane/error.hpp"
#include "common/env.hpp"
#include "device/gid.hpp"

namespace gradlane {

// The opened device shared by a Device's copies, its MemoryRegions and its Connections.
struct Device::State {
  struct DeallocPd {
    void operator()(ibv_pd* pd) const noexcept {
      if (int rc = ibv_dealloc_pd(pd); rc != 0) {
        std::fprintf(stderr, "gradlane: %s (an MR or QP still uses it)\n",
                     detail::call_failed("ibv_dealloc_pd", rc).c_str());
      }
    }
  };
  // Owned by librdmacm (rdma_get_devices keeps every device open for the process lifetime),
  // so rdma_cm ids resolved to this device share the context and can use our PD.
  ibv_context* context = nullptr;
  std::unique_ptr<ibv_pd, DeallocPd> pd;
  DeviceInfo info;
};

namespace {

// rdma_get_devices() returns the contexts librdmacm keeps open for the whole process; using
// them (rather than our own ibv_open_device) lets rdma_cm ids share our protection domain.
struct RdmaDeviceList {
  ibv_context** list = nullptr;
  int count = 0;
  RdmaDeviceList() {
    list = rdma_get_devices(&count);
    if (list == nullptr) {
      detail::throw_call_failed(Errc::device_not_found,
                                "rdma_get_devices (is an RDMA driver loaded? see `rdma link show`)",
                                detail::last_errno_or(ENODEV));
    }
  }
  ~RdmaDeviceList() { rdma_free_devices(list); }
  RdmaDeviceList(const RdmaDeviceList&) = delete;
  RdmaDeviceList& operator=(const RdmaDeviceList&) = delete;
};

std::string port_state_name(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
    default:
      return "NOP";
  }
}

std::vector<detail::GidEntry> read_gid_table(ibv_context* ctx, std::uint8_t port, int table_len) {
  std::vector<ibv_gid_entry> raw(static_cast<std::size_t>(std::max(table_len, 1)));
  const ssize_t n = ibv_query_gid_table(ctx, raw.data(), raw.size(), 0);
  if (n < 0) {
    detail::throw_call_failed(Errc::system, fmt::format("ibv_query_gid_table({})", ibv_get_device_name(ctx->device)),
                              static_cast<int>(-n));
  }
  std::vector<detail::GidEntry> table;
  for (ssize_t i = 0; i < n; ++i) {
    const ibv_gid_entry& e = raw[static_cast<std::size_t>(i)];
    if (e.port_num != port) continue;
    detail::GidEntry entry;
    entry.index = static_cast<int>(e.gid_index);
    entry.type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? detail::GidType::roce_v2
                 : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? detail::GidType::roce_v1
                                                      : detail::GidType::ib;
    std::memcpy(entry.raw.data(), e.gid.raw, 16);
    table.push_back(entry);
  }
  std::sort(table.begin(), table.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
  return table;
}

std::string table_summary(const std::vector<detail::GidEntry>& table) {
  std::string s;
  for (const auto& e : table) {
    s += fmt::format("\n  [{}] {} {}", e.index, detail::gid_text(e.raw), detail::gid_type_name(e.type));
  }
  return s.empty() ? std::string("\n  (empty)") : s;
}

}  // namespace

DeviceSelector DeviceSelector::from_env(const std::function<std::optional<std::string>(const char*)>& getenv_fn) {
  const auto getenv = detail::env_or_process(getenv_fn);
  DeviceSelector s;
  if (auto name = getenv("GRADLANE_DEVICE")) s.name = *name;
  if (auto index = detail::env_integer(getenv, "GRADLANE_GID_INDEX", 0, 255)) s.gid_index = static_cast<int>(*index);
  return s;
}

std::vector<std::string> Device::list() {
  RdmaDeviceList devices;
  std::vector<std::string> names;
  for (int i = 0; i < devices.count; ++i) names.emplace_back(ibv_get_device_name(devices.list[i]->device));
  return names;
}

Device Device::open(const DeviceSelector& selector) {
  // Must precede every registration so fork() in the application (data loaders!) cannot
  // leave the NIC writing into pages the child now owns. A no-op on kernels that make it
  // unnecessary.
  if (int rc = ibv_fork_init(); rc != 0) {
    detail::throw_call_failed(Errc::system, "ibv_fork_init (call Device::open before registering any memory)", rc);
  }
  RdmaDeviceList devices;
  ibv_context* ctx = nullptr;
  std::string names;
  for (int i = 0; i < devices.count; ++i) {
    const char* name = ibv_get_device_name(devices.list[i]->device);
    names += names.empty() ? name : std::string(", ") + name;
    if (selector.name.empty() ? devices.count == 1 : selector.name == name) ctx = devices.list[i];
  }
  if (ctx == nullptr) {
    if (devices.count == 0) {
      throw Error(Errc::device_not_found,
                  "no RDMA device found: load a driver (for Soft-RoCE: `modprobe rdma_rxe && rdma link add "
                  "rxe0 type rxe netdev eth0`) and check `rdma link show`");
    }
    throw Error(Errc::device_not_found,
                selector.name.empty()
                    ? fmt::format("several RDMA devices ({}): choose one by name (-d / GRADLANE_DEVICE)", names)
                    : fmt::format("no RDMA device named '{}'; devices present: {}", selector.name, names));
  }

  auto state = std::make_shared<State>();
  state->context = ctx;
  DeviceInfo& info = state->info;
  info.name = ibv_get_device_name(ctx->device);
  info.port = selector.port;

  ibv_device_attr dev_attr{};
  if (int rc = ibv_query_device(ctx, &dev_attr); rc != 0) {
    detail::throw_call_failed(Errc::system, fmt::format("ibv_query_device({})", info.name), rc);
  }
  if (selector.port == 0 || selector.port > dev_attr.phys_port_cnt) {
    throw Error(Errc::invalid_argument, fmt::format("{} has {} port(s); port {} does not exist", info.name,
                                                    dev_attr.phys_port_cnt, selector.port));
  }
  info.max_qp_wr = static_cast<std::uint32_t>(dev_attr.max_qp_wr);
  info.max_mr_size = dev_attr.max_mr_size;
  info.max_rd_atomic = std::max(1, std::min({dev_attr.max_qp_rd_atom, dev_attr.max_qp_init_rd_atom, 16}));
  info.memory_windows =
      (dev_attr.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
  info.max_memory_windows = static_cast<std::uint32_t>(std::max(0, dev_attr.max_mw));
  info.vendor_id = dev_attr.vendor_id;
  // rdma_rxe reports vendor id 0xffffff (RXE_VENDOR_ID); see DeviceInfo::window_bounds_checked.
  constexpr std::uint32_t kRxeVendorId = 0xffffff;
  info.window_bounds_checked = info.memory_windows && info.vendor_id != kRxeVendorId;

  ibv_port_attr port_attr{};
  if (int rc = ibv_query_port(ctx, selector.port, &port_attr); rc != 0) {
    detail::throw_call_failed(Errc::system, fmt::format("ibv_query_port({}, {})", info.name, selector.port), rc);
  }
  const bool ethernet = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  info.link_layer = ethernet ? "Ethernet" : "InfiniBand";
  info.port_state = port_state_name(port_attr.state);
  // 2^31 is the IB/RoCE ceiling; a provider that reports 0 gets that.
  info.max_message_bytes = port_attr.max_msg_sz != 0 ? port_attr.max_msg_sz : (1ull << 31);
  info.active_mtu = 128u << static_cast<unsigned>(port_attr.active_mtu);
  if (port_attr.state != IBV_PORT_ACTIVE) {
    throw Error(Errc::port_not_active,
                fmt::format("{} port {} is {}, not ACTIVE: bring its link up (`ip link set <netdev> up` for "
                            "RoCE; check the cable / subnet manager for InfiniBand), see `rdma link show`",
                            info.name, selector.port, info.port_state));
  }

  const auto table = read_gid_table(ctx, selector.port, port_attr.gid_tbl_len);
  std::optional<int> index;
  // The selector's index, else the environment's: every program honours GRADLANE_GID_INDEX.
  const int wanted = selector.gid_index >= 0 ? selector.gid_index : DeviceSelector::from_env().gid_index;
  if (wanted >= 0) {
    const bool present = std::any_of(table.begin(), table.end(), [&](const auto& e) { return e.index == wanted; });
    if (!present) {
      throw Error(Errc::no_usable_gid,
                  fmt::format("{} port {} has no GID at index {}{}; valid entries:{}", info.name, selector.port, wanted,
                              selector.gid_index >= 0 ? "" : " (from GRADLANE_GID_INDEX)", table_summary(table)));
    }
    index = wanted;
  } else {
    index = detail::choose_gid_index(table, ethernet);
    if (!index) {
      throw Error(Errc::no_usable_gid,
                  fmt::format("{} port {} has no RoCE v2 GID with an IPv4 address — give its netdev an IPv4 "
                              "address (`ip addr add A.B.C.D/N dev <netdev>`) or pick one with -x. GID table:{}",
                              info.name, selector.port, table_summary(table)));
    }
  }
  const auto& entry = *std::find_if(table.begin(), table.end(), [&](const auto& e) { return e.index == *index; });
  info.gid_index = *index;
  info.gid = detail::gid_text(entry.raw);
  info.gid_type = detail::gid_type_name(entry.type);
  info.ipv4_address = detail::gid_ipv4(entry.raw).value_or("");

  state->pd.reset(ibv_alloc_pd(ctx));
  if (!state->pd) {
    detail::throw_call_failed(Errc::system, fmt::format("ibv_alloc_pd({})", info.name), detail::last_errno_or(ENOMEM));
  }
  return Device(std::move(state));
}

const DeviceInfo& Device::info() const { return state_->info; }
ibv_context* Device::context() const { return state_->context; }
ibv_pd* Device::pd() const { return state_->pd.get(); }

}  // namespace gradlane
