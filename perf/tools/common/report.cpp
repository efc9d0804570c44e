#include "common/report.hpp"

#include <infiniband/verbs.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "gradlane/error.hpp"

#ifndef GRADLANE_PERF_VERSION
#define GRADLANE_PERF_VERSION "unknown"
#endif

namespace gradlane::perf {
namespace {

// printf with perftest's own format strings: the exact spacing is the contract.
template <class... Args>
std::string cformat(const char* format, Args... args) {
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, format, args...);
  return buffer;
}

constexpr double kBytesPerGbit = 125'000'000.0;  // perftest's format_factor for --report_gbits
constexpr double kBytesPerMB = 1048576.0;        // ... and for MB/sec (0x100000)

std::string transport_type(const DeviceInfo& info) {
  // perftest prints the verbs transport type: IB for InfiniBand and RoCE alike.
  return info.link_layer == "InfiniBand" || info.link_layer == "Ethernet" ? "IB" : info.link_layer;
}

}  // namespace

std::string header_block(const HeaderFacts& f) {
  const PerfOptions& o = *f.options;
  const DeviceInfo& d = *f.device;
  const bool bw = o.kind.measure == Measure::bandwidth;
  std::string s = kResultLine;
  s += fmt::format("                    {}\n", o.kind.title);
  s += fmt::format(" Dual-port       : OFF\t\tDevice         : {}\n", d.name);
  s += fmt::format(" Number of qps   : {}\t\tTransport type : {}\n", f.qps, transport_type(d));
  s += " Connection type : RC\t\tUsing SRQ      : OFF\n";
  s += " PCIe relax order: OFF\n";
  s += " ibv_wr* API     : OFF\n";
  if (!o.is_server()) s += fmt::format(" TX depth        : {}\n", f.tx_depth);
  if (bw) s += fmt::format(" CQ Moderation   : {}\n", f.cq_mod);
  s += fmt::format(" Mtu             : {}[B]\n", d.active_mtu);
  s += fmt::format(" Link type       : {}\n", d.link_layer == "Ethernet" ? "Ethernet" : "IB");
  s += fmt::format(" GID index       : {}\n", d.gid_index);
  if (o.kind.verb == Verb::write) {
    s += fmt::format(" Max inline data : {}[B]\n", f.inline_granted);
  } else {
    s += fmt::format(" Outstand reads  : {}\n", f.outstanding_reads);
  }
  s += " rdma_cm QPs\t : ON\n";
  s += " Data ex. method : rdma_cm\n";
  s += fmt::format(" Library         : gradlane {} (public API: Connection::{})\n", GRADLANE_PERF_VERSION,
                   o.kind.verb == Verb::write ? "write" : "read");
  s += fmt::format(" Connection      : {}\n", f.connection);
  s += fmt::format(" GID             : {} {}\n", d.gid, d.gid_type);
  s += kResultLine;
  return s;
}

// ---- bandwidth -----------------------------------------------------------------------------

BwRow bw_row(const BwSample& sample, double ticks_per_usec, bool gbits) {
  const double factor = gbits ? kBytesPerGbit : kBytesPerMB;
  const double ticks_per_sec = ticks_per_usec * 1e6;
  BwRow row;
  row.bytes = sample.bytes;
  row.iterations = sample.iterations;
  const double span = static_cast<double>(sample.last_completion - sample.first_post);
  if (span > 0) {
    const double seconds = span / ticks_per_sec;
    row.average = static_cast<double>(sample.bytes) * static_cast<double>(sample.operations) / seconds / factor;
    row.msg_rate_mpps = static_cast<double>(sample.operations) / seconds / 1e6;
  }
  if (sample.wall_seconds > 0) {
    row.wall_average =
        static_cast<double>(sample.bytes) * static_cast<double>(sample.operations) / sample.wall_seconds / factor;
  }
  // perftest searches every window (O(n²)); above 20 000 operations we step the window start
  // so the search stays under ~2·10⁸ comparisons.
  const std::size_t n = std::min(sample.posted.size(), sample.completed.size());
  if (n > 0) {
    const std::size_t stride = std::max<std::size_t>(1, n / 20'000);
    double best = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < n; i += stride) {
      for (std::size_t j = i; j < n; ++j) {
        const double per_op =
            static_cast<double>(sample.completed[j] - sample.posted[i]) / static_cast<double>(j - i + 1);
        best = std::min(best, per_op);
      }
    }
    if (best > 0 && std::isfinite(best)) row.peak = static_cast<double>(sample.bytes) * ticks_per_sec / best / factor;
  }
  return row;
}

std::string bw_title(bool gbits) {
  return gbits ? " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
               : " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n";
}

std::string bw_line(const BwRow& r, bool gbits) {
  // perftest switches to six decimals when a Gb/s average would print as 0.0x (REPORT_FMT_EXT).
  const bool extended = gbits && r.average < 0.1;
  const auto bytes = static_cast<unsigned long>(r.bytes);
  const auto iters = static_cast<unsigned long>(r.iterations);
  return extended ? cformat(" %-7lu    %lu           %-7.6lf            %-7.6lf            %-7.6lf\n", bytes, iters,
                            r.peak, r.average, r.msg_rate_mpps)
                  : cformat(" %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t   %-7.6lf\n", bytes, iters, r.peak,
                            r.average, r.msg_rate_mpps);
}

std::optional<BwRow> parse_bw_line(const std::string& line) {
  std::istringstream in(line);
  BwRow r;
  unsigned long bytes = 0, iters = 0;
  if (!(in >> bytes >> iters >> r.peak >> r.average >> r.msg_rate_mpps)) return std::nullopt;
  r.bytes = bytes;
  r.iterations = iters;
  return r;
}

// ---- latency -------------------------------------------------------------------------------

LatRow lat_row(std::size_t bytes, std::uint64_t iterations, const std::vector<Ticks>& posted, double ticks_per_usec,
               int rtt_factor) {
  if (posted.size() < 5) throw Error(Errc::invalid_argument, "a latency report needs at least 5 samples");
  const double unit = ticks_per_usec * rtt_factor;
  std::vector<Ticks> delta(posted.size() - 1);
  for (std::size_t i = 0; i + 1 < posted.size(); ++i) delta[i] = posted[i + 1] - posted[i];
  std::sort(delta.begin(), delta.end());
  // perftest drops the two largest samples (LAT_MEASURE_TAIL) before every statistic.
  const std::size_t n = delta.size() - 2;
  const double median = (n - 1) % 2 ? (static_cast<double>(delta[n / 2]) + static_cast<double>(delta[n / 2 - 1])) / 2
                                    : static_cast<double>(delta[n / 2]);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(delta[i]) / unit;
  const double average = sum / static_cast<double>(n);
  double squares = 0;
  // perftest truncates each deviation to whole µs before squaring; we keep the fraction.
  for (std::size_t i = 0; i < n; ++i) squares += std::pow(average - static_cast<double>(delta[i]) / unit, 2);
  LatRow r;
  r.bytes = bytes;
  r.iterations = iterations;
  r.t_min = static_cast<double>(delta[0]) / unit;
  r.t_max = static_cast<double>(delta[n]) / unit;
  r.t_typical = median / unit;
  r.t_avg = average;
  r.t_stdev = std::sqrt(squares / static_cast<double>(n));
  r.p99 = static_cast<double>(delta[static_cast<std::size_t>(std::ceil(static_cast<double>(n) * 0.99))]) / unit;
  r.p999 = static_cast<double>(delta[static_cast<std::size_t>(std::ceil(static_cast<double>(n) * 0.999))]) / unit;
  return r;
}

std::string lat_title() {
  return " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% "
         "percentile[usec]   99.9% percentile[usec] \n";
}

std::string lat_line(const LatRow& r) {
  return cformat(
      " %-7lu %lu          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
      static_cast<unsigned long>(r.bytes), static_cast<unsigned long>(r.iterations), r.t_min, r.t_max, r.t_typical,
      r.t_avg, r.t_stdev, r.p99, r.p999);
}

std::optional<LatRow> parse_lat_line(const std::string& line) {
  std::istringstream in(line);
  LatRow r;
  unsigned long bytes = 0, iters = 0;
  if (!(in >> bytes >> iters >> r.t_min >> r.t_max >> r.t_typical >> r.t_avg >> r.t_stdev >> r.p99 >> r.p999)) {
    return std::nullopt;
  }
  r.bytes = bytes;
  r.iterations = iters;
  return r;
}

std::string lat_duration_title() { return " #bytes        #iterations       t_avg[usec]    tps average\n"; }

std::string lat_duration_line(std::size_t bytes, std::uint64_t iterations, double t_avg_usec) {
  const double tps = t_avg_usec > 0 ? 1e6 / t_avg_usec : 0;
  return cformat(" %-7lu       %-10lu        %-7.2f        %-7.2f\n", static_cast<unsigned long>(bytes),
                 static_cast<unsigned long>(iterations), t_avg_usec, tps);
}

// ---- JSON ----------------------------------------------------------------------------------

nlohmann::json test_info_json(const HeaderFacts& f) {
  const PerfOptions& o = *f.options;
  const DeviceInfo& d = *f.device;
  std::string test = o.kind.title;
  std::replace(test.begin(), test.end(), ' ', '_');
  nlohmann::json j = {
      {"test", test},
      {"tool", o.kind.name},
      {"library", std::string("gradlane ") + GRADLANE_PERF_VERSION},
      {"role", o.is_server() ? "server" : "client"},
      {"Dual_port", "OFF"},
      {"Device", d.name},
      {"Number_of_qps", f.qps},
      {"Transport_type", transport_type(d)},
      {"Connection_type", "RC"},
      {"Using_SRQ", "OFF"},
      {"Mtu", d.active_mtu},
      {"Link_type", d.link_layer == "Ethernet" ? "Ethernet" : "IB"},
      {"GID_index", d.gid_index},
      {"rdma_cm_QPs", "ON"},
      {"Data_ex_method", "rdma_cm"},
      {"Connection", f.connection},
  };
  if (!o.is_server()) j["TX_depth"] = f.tx_depth;
  if (o.kind.measure == Measure::bandwidth) j["CQ_Moderation"] = f.cq_mod;
  if (o.kind.verb == Verb::write) {
    j["Max_inline_data"] = f.inline_granted;
  } else {
    j["Outstand_reads"] = f.outstanding_reads;
  }
  return j;
}

nlohmann::json to_json(const BwRow& r, bool gbits) {
  return {{"MsgSize", r.bytes},           {"n_iterations", r.iterations},   {"bw_peak", r.peak},
          {"bw_avg", r.average},          {"msgRate_avg", r.msg_rate_mpps}, {"bw_unit", gbits ? "Gb/sec" : "MB/sec"},
          {"bw_avg_wall", r.wall_average}};
}

nlohmann::json to_json(const LatRow& r) {
  return {{"MsgSize", r.bytes},   {"n_iterations", r.iterations}, {"t_min", r.t_min},
          {"t_max", r.t_max},     {"t_typical", r.t_typical},     {"t_avg", r.t_avg},
          {"t_stdev", r.t_stdev}, {"percentile_99", r.p99},       {"percentile_99.9", r.p999}};
}

void write_json_file(const std::string& path, const nlohmann::json& document) {
  std::ofstream out(path, std::ios::trunc);
  out << document.dump(2) << '\n';
  if (!out) throw Error(Errc::system, fmt::format("cannot write the JSON report to '{}'", path));
}

}  // namespace gradlane::perf
