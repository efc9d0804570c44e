#include "doctor/checks.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <memory>

#include <fmt/format.h>

namespace gradlane::doctor {
namespace {

const char* status_tag(Status s) { return s == Status::ok ? "[ OK ]" : s == Status::warn ? "[WARN]" : "[FAIL]"; }
const char* status_name(Status s) { return s == Status::ok ? "ok" : s == Status::warn ? "warn" : "fail"; }

std::string human_bytes(std::uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1ull << 20));
  return fmt::format("{} KiB", b >> 10);
}

struct DeviceListFree {
  void operator()(ibv_device** l) const noexcept { ibv_free_device_list(l); }
};

// One GID entry as a person reads it.
struct GidRow {
  int index = 0;
  std::string gid, type, netdev, ipv4;
};

std::vector<GidRow> read_gids(ibv_context* ctx, std::uint8_t port) {
  ibv_port_attr port_attr{};
  if (ibv_query_port(ctx, port, &port_attr) != 0) return {};
  std::vector<ibv_gid_entry> raw(static_cast<std::size_t>(std::max(1, port_attr.gid_tbl_len)));
  const ssize_t n = ibv_query_gid_table(ctx, raw.data(), raw.size(), 0);
  std::vector<GidRow> rows;
  for (ssize_t i = 0; i < n; ++i) {
    const ibv_gid_entry& e = raw[static_cast<std::size_t>(i)];
    if (e.port_num != port) continue;
    GidRow r;
    r.index = static_cast<int>(e.gid_index);
    char text[INET6_ADDRSTRLEN] = "";
    ::inet_ntop(AF_INET6, e.gid.raw, text, sizeof text);
    r.gid = text;
    r.type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1" : "IB";
    char name[IF_NAMESIZE] = "";
    if (e.ndev_ifindex != 0 && ::if_indextoname(e.ndev_ifindex, name) != nullptr) r.netdev = name;
    static constexpr unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(e.gid.raw, kMapped, 12) == 0) {
      char v4[INET_ADDRSTRLEN] = "";
      ::inet_ntop(AF_INET, e.gid.raw + 12, v4, sizeof v4);
      r.ipv4 = v4;
    }
    rows.push_back(r);
  }
  return rows;
}

// The IPv4 prefix of `netdev` that holds `address`, e.g. "198.18.0.1/24".
std::optional<std::pair<in_addr, in_addr>> netdev_prefix(const std::string& netdev, const std::string& address) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owner(list, &::freeifaddrs);
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_netmask == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (netdev != a->ifa_name) continue;
    const auto addr = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr;
    char text[INET_ADDRSTRLEN] = "";
    ::inet_ntop(AF_INET, &addr, text, sizeof text);
    if (address == text) return std::make_pair(addr, reinterpret_cast<const sockaddr_in*>(a->ifa_netmask)->sin_addr);
  }
  return std::nullopt;
}

void check_memlock(const DoctorOptions& o, Report& report) {
  rlimit limit{};
  ::getrlimit(RLIMIT_MEMLOCK, &limit);
  const bool unlimited = limit.rlim_cur == RLIM_INFINITY;
  const std::string now = unlimited ? "unlimited" : human_bytes(limit.rlim_cur);
  try {
    gradlane::check_memlock(o.pin);
    const bool by_capability = !unlimited && limit.rlim_cur < o.pin;
    report.add(Status::ok, "memlock",
               by_capability ? fmt::format("RLIMIT_MEMLOCK {}, but this process has CAP_IPC_LOCK (root), which lifts "
                                           "it; a job run as another user needs `ulimit -l` ≥ {}",
                                           now, human_bytes(o.pin))
                             : fmt::format("RLIMIT_MEMLOCK {} (enough to pin {})", now, human_bytes(o.pin)));
  } catch (const Error& e) {
    report.add(Status::fail, "memlock",
               fmt::format("RLIMIT_MEMLOCK is {}: too small to pin {}", now, human_bytes(o.pin)), e.what());
  }
}

void check_rdma_cm(Report& report) {
  if (::access("/dev/infiniband/rdma_cm", R_OK | W_OK) == 0) {
    report.add(Status::ok, "rdma_cm", "/dev/infiniband/rdma_cm is usable");
  } else {
    report.add(Status::fail, "rdma_cm", fmt::format("/dev/infiniband/rdma_cm: {}", std::strerror(errno)),
               "load the rdma_ucm module (`modprobe rdma_ucm`); in a container, pass --device /dev/infiniband");
  }
}

void check_gids(const DoctorOptions& o, const Device& device, Report& report) {
  const DeviceInfo& info = device.info();
  const auto rows = read_gids(device.context(), info.port);
  std::string table;
  const GidRow* chosen = nullptr;
  int ipv4_netdevs = 0;
  std::string seen_netdevs;
  for (const auto& r : rows) {
    if (r.gid == "::" || r.gid.empty()) continue;
    table += fmt::format("\n         [{}] {} {}{}{}", r.index, r.gid, r.type, r.netdev.empty() ? "" : " on " + r.netdev,
                         r.index == info.gid_index ? "   <- selected" : "");
    if (r.index == info.gid_index) chosen = &r;
    if (!r.ipv4.empty() && r.type == "RoCE v2" && seen_netdevs.find("|" + r.netdev + "|") == std::string::npos) {
      seen_netdevs += "|" + r.netdev + "|";
      ++ipv4_netdevs;
    }
  }
  if (chosen == nullptr) {
    report.add(Status::fail, "GID",
               fmt::format("GID index {} is not in {}'s table:{}", info.gid_index, info.name, table),
               "pick an index from the table with -x (GRADLANE_GID_INDEX)");
    return;
  }
  if (info.link_layer == "Ethernet" && (chosen->type != "RoCE v2" || chosen->ipv4.empty())) {
    report.add(Status::warn, "GID",
               fmt::format("GID {} is {} {}: rdma_cm needs an IPv4-mapped RoCE v2 GID as the source address:{}",
                           info.gid_index, chosen->type, chosen->gid, table),
               "choose the RoCE v2 entry carrying the interface's IPv4 address with -x (perftest's -x)");
    return;
  }
  report.add(Status::ok, "GID",
             fmt::format("index {} = {} {}{}: source address {}{}", info.gid_index, chosen->gid, chosen->type,
                         chosen->netdev.empty() ? "" : " on " + chosen->netdev, info.ipv4_address, table));
  if (ipv4_netdevs > 1) {
    report.add(Status::warn, "interface",
               fmt::format("{} has IPv4 RoCE v2 GIDs on {} netdevs; the job uses {} ({})", info.name, ipv4_netdevs,
                           chosen->netdev, info.ipv4_address),
               "make sure every rank picks the GID of the interface its peers reach (-x / GRADLANE_GID_INDEX)");
  }
  if (!o.peer.empty() && !chosen->netdev.empty()) {
    in_addr peer{};
    const auto prefix = netdev_prefix(chosen->netdev, info.ipv4_address);
    if (prefix && ::inet_pton(AF_INET, o.peer.c_str(), &peer) == 1 &&
        (peer.s_addr & prefix->second.s_addr) != (prefix->first.s_addr & prefix->second.s_addr)) {
      report.add(Status::warn, "interface",
                 fmt::format("the peer {} is not on {}'s subnet: its traffic is routed, or leaves by another "
                             "interface than the one this GID belongs to",
                             o.peer, chosen->netdev),
                 "use the peer's address on the RDMA network, or select the GID of the interface on that subnet");
    }
  }
}

}  // namespace

void Report::add(Status status, std::string check, std::string detail, std::string fix) {
  findings_.push_back({status, std::move(check), std::move(detail), std::move(fix)});
  print_last();
}

bool Report::failed() const {
  return std::any_of(findings_.begin(), findings_.end(), [](const auto& f) { return f.status == Status::fail; });
}

void Report::print_last() const {
  const Finding& f = findings_.back();
  std::cout << status_tag(f.status) << ' ' << f.check << ": " << f.detail << '\n';
  if (!f.fix.empty()) std::cout << "       fix: " << f.fix << '\n';
  std::cout << std::flush;
}

std::string Report::summary() const {
  int ok = 0, warn = 0, fail = 0;
  for (const auto& f : findings_) (f.status == Status::ok ? ok : f.status == Status::warn ? warn : fail)++;
  return fmt::format("doctor: {} passed, {} failed, {} warnings", ok, fail, warn);
}

nlohmann::json Report::to_json() const {
  nlohmann::json checks = nlohmann::json::array();
  int ok = 0, warn = 0, fail = 0;
  for (const auto& f : findings_) {
    checks.push_back({{"check", f.check}, {"status", status_name(f.status)}, {"detail", f.detail}, {"fix", f.fix}});
    (f.status == Status::ok ? ok : f.status == Status::warn ? warn : fail)++;
  }
  return {{"checks", checks}, {"passed", ok}, {"warnings", warn}, {"failed", fail}};
}

std::optional<Device> check_local(const DoctorOptions& o, Report& report) {
  std::unique_ptr<ibv_device*, DeviceListFree> list(ibv_get_device_list(nullptr));
  if (!list || list.get()[0] == nullptr) {
    report.add(Status::fail, "devices", "no RDMA device (ibv_get_device_list is empty)",
               "load the NIC's driver (mlx5_ib, irdma, bnxt_re, ...) or Soft-RoCE (`modprobe rdma_rxe && rdma link add "
               "rxe0 type rxe netdev eth0`); in a container pass --device /dev/infiniband; check `rdma link show`");
    check_memlock(o, report);
    return std::nullopt;
  }
  std::string names;
  for (ibv_device** d = list.get(); *d != nullptr; ++d) names += (names.empty() ? "" : ", ") + std::string((*d)->name);
  report.add(Status::ok, "devices", names);

  std::optional<Device> device;
  try {
    device = Device::open(o.device);
  } catch (const Error& e) {
    report.add(Status::fail, "device", e.what(),
               e.code() == Errc::device_not_found  ? "name one of the devices above with -d (GRADLANE_DEVICE)"
               : e.code() == Errc::port_not_active ? "bring the link up; `rdma link show` shows the port state"
                                                   : "see the message above");
  }
  if (device) {
    const DeviceInfo& i = device->info();
    report.add(Status::ok, "port",
               fmt::format("{} port {}: {}, {}{}, active MTU {}", i.name, i.port, i.port_state, i.link_layer,
                           i.link_layer == "Ethernet" ? " (RoCE)" : "", i.active_mtu));
    if (i.link_layer == "Ethernet" && i.active_mtu < 1024) {
      report.add(Status::warn, "mtu", fmt::format("active MTU {} is small", i.active_mtu),
                 "raise the netdev's MTU (RoCE MTU follows it: 1500 → 1024, 9000 → 4096)");
    }
    check_gids(o, *device, report);
  }
  check_memlock(o, report);
  check_rdma_cm(report);
  return device;
}

}  // namespace gradlane::doctor
