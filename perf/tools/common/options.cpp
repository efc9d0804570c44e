#include "common/options.hpp"

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>

namespace gradlane::perf {

std::vector<std::size_t> PerfOptions::sizes() const {
  if (!all_sizes) return {size};
  std::vector<std::size_t> all;
  for (std::size_t s = 2; s <= kMaxSize; s *= 2) all.push_back(s);
  return all;
}

int PerfOptions::cq_mod_for(std::size_t bytes) const {
  int mod = cq_mod.value_or(bytes > kCqModSizeLimit ? 1 : kDefaultCqMod);
  return std::max(1, std::min(mod, tx_depth));
}

TransportOptions PerfOptions::transport() const {
  TransportOptions o = TransportOptions::from_env();
  // The tool, not the library, bounds what is in flight (-t, as perftest), and it chooses
  // which writes are signalled (-Q): the queue is sized so the library's own automatic
  // signalling (every signal_interval-th unsignalled op) never fires first.
  o.send_queue_depth = std::max<std::uint32_t>(256, 2 * static_cast<std::uint32_t>(tx_depth));
  o.signal_interval = o.send_queue_depth / 2;
  if (inline_size) o.max_inline = static_cast<std::uint32_t>(*inline_size);
  o.connect_timeout = std::chrono::milliseconds(std::max(1000, std::min(timeout * 1000, 20'000)));
  return o;
}

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::optional<std::string>(v) : std::nullopt;
}

[[noreturn]] void usage_error(const std::string& tool, const std::string& what) {
  std::cerr << tool << ": " << what << "\nRun with --help for the options.\n";
  std::exit(1);
}

}  // namespace

PerfOptions parse_options(const ToolKind& kind, int argc, char** argv) {
  PerfOptions o;
  o.kind = kind;
  const bool bw = kind.measure == Measure::bandwidth;
  o.size = bw ? 65536 : 2;  // perftest's DEF_SIZE_BW / DEF_SIZE_LAT
  o.iterations = bw ? 5000 : 1000;
  o.tx_depth = bw ? 128 : 1;

  CLI::App app{std::string(kind.title) +
               " over gradlane (the public API), in perftest's format.\n"
               "Server: run with no address. Client: run with the server's address."};
  app.get_formatter()->column_width(34);
  std::string device_name;
  int gid_index = -1, ib_port = 1;
  std::uint64_t size = o.size, iterations = o.iterations;
  int cq_mod = 0, inline_size = -1;
  bool out_json = false;
  std::string json_file;
  app.add_option("address", o.server_address, "server address (client mode); absent = server mode");
  app.add_option("-d,--ib-dev", device_name, "RDMA device (default: GRADLANE_DEVICE, else the only device)");
  app.add_option("-x,--gid-index", gid_index,
                 "GID index: its IPv4 address is the source address "
                 "(default: GRADLANE_GID_INDEX, else the first RoCE v2 IPv4 GID)")
      ->check(CLI::Range(0, 255));
  app.add_option("-i,--ib-port", ib_port, "device port")->check(CLI::Range(1, 255));
  app.add_option("-p,--port", o.port, "rdma_cm port to listen on / connect to")->check(CLI::Range(1, 65535));
  auto* size_opt = app.add_option("-s,--size", size, "message size in bytes")
                       ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{kMaxSize}));
  auto* all_opt = app.add_flag("-a,--all", o.all_sizes, "run all sizes from 2 B to 8 MiB");
  all_opt->excludes(size_opt);
  auto* iters_opt = app.add_option("-n,--iters", iterations, "iterations per size (and per QP)")
                        ->check(CLI::Range(kMinIterations, std::uint64_t{100'000'000}));
  app.add_option("-q,--qp", o.qps, "number of QPs (connections)")->check(CLI::Range(1, 16));
  app.add_option("-t,--tx-depth", o.tx_depth, "operations in flight per QP")->check(CLI::Range(1, 8192));
  auto* cq_opt = app.add_option("-Q,--cq-mod", cq_mod,
                                "signal one completion every N operations "
                                "(default as perftest: 100, or 1 above 8 KiB)")
                     ->check(CLI::Range(1, 1024));
  auto* inline_opt = app.add_option("-I,--inline_size", inline_size,
                                    "inline payloads up to this size (default: GRADLANE_MAX_INLINE, 64)")
                         ->check(CLI::Range(0, 1024));
  app.add_flag("--report_gbits", o.report_gbits, "report bandwidth in Gb/s (default MB/s)");
  app.add_flag("--out_json", out_json, "also write the results as JSON (to --out_json_file)");
  app.add_option("--out_json_file", json_file, "JSON results file (implies --out_json)");
  auto* duration_opt = app.add_option("-D,--duration", o.duration, "run for this many seconds instead of -n")
                           ->check(CLI::Range(1, 3600));
  duration_opt->excludes(iters_opt);
  app.add_option("--timeout", o.timeout, "seconds to wait for the peer (connect, accept, every handshake)")
      ->check(CLI::Range(1, 86400));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    usage_error(kind.name, e.what());
  }

  o.device.name = !device_name.empty() ? device_name : env("GRADLANE_DEVICE").value_or("");
  if (gid_index >= 0) {
    o.device.gid_index = gid_index;
  } else if (auto g = env("GRADLANE_GID_INDEX")) {
    char* end = nullptr;
    const long v = std::strtol(g->c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > 255) usage_error(kind.name, "GRADLANE_GID_INDEX='" + *g + "' is not a GID index");
    o.device.gid_index = static_cast<int>(v);
  }
  o.device.port = static_cast<std::uint8_t>(ib_port);
  o.size = static_cast<std::size_t>(size);
  o.iterations = iterations;
  if (*cq_opt) o.cq_mod = cq_mod;
  if (*inline_opt) o.inline_size = inline_size;
  if (out_json || !json_file.empty()) o.json_file = json_file.empty() ? std::string(kind.name) + ".json" : json_file;
  if (kind.measure == Measure::latency && o.qps != 1) {
    usage_error(kind.name, "latency tests use one QP (as perftest's); drop -q");
  }
  if (kind.measure == Measure::latency && o.tx_depth != 1) {
    usage_error(kind.name, "latency tests keep one operation in flight (-t 1)");
  }
  return o;
}

}  // namespace gradlane::perf
