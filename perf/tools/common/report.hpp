// perftest's report, column for column: the header block, the result table headings and
// the row formats are perftest's own (perftest_parameters.h: RESULT_FMT_G, REPORT_FMT,
// REPORT_FMT_EXT, RESULT_FMT_LAT, REPORT_FMT_LAT), so a script that parses one parses both.
// Statistics follow perftest's print_report_bw / print_report_lat exactly where it matters
// (which samples, which median, which percentile index); see lat_stats().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/options.hpp"
#include "common/ticks.hpp"
#include "gradlane/gradlane.hpp"

namespace gradlane::perf {

inline constexpr const char* kResultLine =
    "---------------------------------------------------------------------------------------\n";

struct HeaderFacts {
  const PerfOptions* options = nullptr;
  const DeviceInfo* device = nullptr;
  int qps = 1;
  int tx_depth = 1;
  int cq_mod = 0;  // 0 = varies with size (perftest's rule)
  std::uint32_t inline_granted = 0;
  int outstanding_reads = 0;
  std::string connection;  // Connection::describe()
};
// perftest's header block (ctx_print_test_info) plus gradlane's own lines at the end.
std::string header_block(const HeaderFacts& facts);

// ---- bandwidth -----------------------------------------------------------------------------

struct BwSample {
  std::size_t bytes = 0;
  std::uint64_t iterations = 0;  // per QP, as perftest reports it
  int qps = 1;
  std::vector<Ticks> posted;     // one stamp per operation, in post order (empty with -D)
  std::vector<Ticks> completed;  // one stamp per operation, in completion order
  Ticks first_post = 0, last_completion = 0;
  std::uint64_t operations = 0;  // all QPs
  double wall_seconds = 0;       // steady_clock around the whole loop, a cross-check
};

struct BwRow {
  std::size_t bytes = 0;
  std::uint64_t iterations = 0;
  double peak = 0, average = 0;  // in the report unit
  double msg_rate_mpps = 0;
  double wall_average = 0;  // bytes / wall time, report unit
};
// BW average = bytes × operations / (last completion − first post); peak = the best
// (completions j − i + 1) / (completed[j] − posted[i]) window, as perftest's print_report_bw.
BwRow bw_row(const BwSample& sample, double ticks_per_usec, bool gbits);
std::string bw_title(bool gbits);
std::string bw_line(const BwRow& row, bool gbits);
// Parses a line produced by bw_line (the server prints the client's line).
std::optional<BwRow> parse_bw_line(const std::string& line);

// ---- latency -------------------------------------------------------------------------------

struct LatRow {
  std::size_t bytes = 0;
  std::uint64_t iterations = 0;
  double t_min = 0, t_max = 0, t_typical = 0, t_avg = 0, t_stdev = 0, p99 = 0, p999 = 0;
};
// From one timestamp per iteration (taken just before each post): deltas between successive
// stamps, divided by `rtt_factor` (2 for write ping-pong: half the round trip; 1 for reads,
// whose full completion time perftest reports), the two largest dropped, median as t_typical.
LatRow lat_row(std::size_t bytes, std::uint64_t iterations, const std::vector<Ticks>& posted, double ticks_per_usec,
               int rtt_factor);
std::string lat_title();
std::string lat_line(const LatRow& row);
std::optional<LatRow> parse_lat_line(const std::string& line);

// Duration mode (-D): perftest prints only the average.
std::string lat_duration_title();
std::string lat_duration_line(std::size_t bytes, std::uint64_t iterations, double t_avg_usec);

// ---- JSON (--out_json_file) ----------------------------------------------------------------
// Valid JSON (perftest's own is not): {"test_info": {...perftest's keys...}, "results": [...]}.
nlohmann::json test_info_json(const HeaderFacts& facts);
nlohmann::json to_json(const BwRow& row, bool gbits);
nlohmann::json to_json(const LatRow& row);
void write_json_file(const std::string& path, const nlohmann::json& document);

}  // namespace gradlane::perf
