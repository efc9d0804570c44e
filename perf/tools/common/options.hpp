// Command-line options shared by the four perftest-style tools, spelled as perftest spells
// them so a command line moves from `ib_write_bw` to `gradlane_write_bw` unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradlane/device.hpp"
#include "gradlane/options.hpp"

namespace gradlane::perf {

enum class Verb { write, read };
enum class Measure { bandwidth, latency };

struct ToolKind {
  Verb verb;
  Measure measure;
  const char* name;   // "gradlane_write_bw"
  const char* title;  // perftest's title, "RDMA_Write BW Test"
  const char* test;   // the JSON / protocol name, "write_bw"
};

inline constexpr ToolKind kWriteBw{Verb::write, Measure::bandwidth, "gradlane_write_bw", "RDMA_Write BW Test",
                                   "write_bw"};
inline constexpr ToolKind kReadBw{Verb::read, Measure::bandwidth, "gradlane_read_bw", "RDMA_Read BW Test", "read_bw"};
inline constexpr ToolKind kWriteLat{Verb::write, Measure::latency, "gradlane_write_lat", "RDMA_Write Latency Test",
                                    "write_lat"};
inline constexpr ToolKind kReadLat{Verb::read, Measure::latency, "gradlane_read_lat", "RDMA_Read Latency Test",
                                   "read_lat"};

// perftest's limits and defaults (perftest_parameters.h), so the same numbers mean the same.
inline constexpr std::uint16_t kDefaultPort = 18515;
inline constexpr std::size_t kMaxSize = std::size_t{8} << 20;  // -a goes 2 B … 8 MiB
inline constexpr std::uint64_t kMinIterations = 5;
inline constexpr int kDefaultCqMod = 100;
inline constexpr std::size_t kCqModSizeLimit = 8192;  // above this perftest signals every write

struct PerfOptions {
  ToolKind kind = kWriteBw;
  DeviceSelector device;                 // -d, -x, -i (GRADLANE_DEVICE / GRADLANE_GID_INDEX if absent)
  std::string server_address;            // positional; empty = this process is the server
  std::uint16_t port = kDefaultPort;     // -p
  std::size_t size = 0;                  // -s
  bool all_sizes = false;                // -a
  std::uint64_t iterations = 0;          // -n
  int qps = 1;                           // -q
  int tx_depth = 0;                      // -t
  std::optional<int> cq_mod;             // -Q (perftest's default rule when absent)
  std::optional<int> inline_size;        // -I (the library's max_inline when absent)
  bool report_gbits = false;             // --report_gbits
  std::optional<std::string> json_file;  // --out_json / --out_json_file
  int duration = 0;                      // -D seconds; 0 = run -n iterations
  int timeout = 60;                      // --timeout seconds: bound on waiting for the peer

  bool is_server() const { return server_address.empty(); }
  std::vector<std::size_t> sizes() const;
  // Writes signalled per completion at this size: -Q, or perftest's rule (100, every write
  // above 8 KiB), never more than the TX depth.
  int cq_mod_for(std::size_t bytes) const;
  // Transport options for this run: GRADLANE_* from the environment, then the flags.
  TransportOptions transport() const;
};

// Parses argv; on a bad flag prints what is wrong and exits 1, on --help prints usage and
// exits 0.
PerfOptions parse_options(const ToolKind& kind, int argc, char** argv);

}  // namespace gradlane::perf
