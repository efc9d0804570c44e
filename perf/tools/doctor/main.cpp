// gradlane_doctor: is this host ready for gradlane, and does RDMA reach the peer?
//
//   gradlane_doctor [-d DEV] [-x GID] [-p PORT]          local checks, then wait for a peer
//   gradlane_doctor [-d DEV] [-x GID] [-p PORT] ADDRESS  local checks, then test ADDRESS
//   gradlane_doctor --local                              local checks only
//
// Prints one line per check ([ OK ] / [WARN] / [FAIL]) with the fix under each failure, and
// exits 0 only when nothing failed.
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/report.hpp"
#include "doctor/checks.hpp"

#ifndef GRADLANE_PERF_VERSION
#define GRADLANE_PERF_VERSION "unknown"
#endif

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::optional<std::string>(v) : std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradlane::doctor;
  DoctorOptions o;
  CLI::App app{
      "gradlane_doctor: checks the RDMA device, GID, memlock and rdma_cm, then a verified RDMA WRITE "
      "each way with a peer running gradlane_doctor. Run it with no address on one host, with that "
      "host's address on the other."};
  std::string device_name;
  int gid_index = -1, ib_port = 1;
  bool local_only = false;
  std::string json_file;
  app.add_option("address", o.peer, "the peer's address (client side); absent = wait for a peer");
  app.add_option("-d,--ib-dev", device_name, "RDMA device (default: GRADLANE_DEVICE, else the only one)");
  app.add_option("-x,--gid-index", gid_index, "GID index (default: GRADLANE_GID_INDEX, else automatic)")
      ->check(CLI::Range(0, 255));
  app.add_option("-i,--ib-port", ib_port, "device port")->check(CLI::Range(1, 255));
  app.add_option("-p,--port", o.port, "rdma_cm port")->check(CLI::Range(1, 65535));
  app.add_option("--timeout", o.timeout, "seconds to wait for the peer")->check(CLI::Range(1, 86400));
  app.add_option("--bytes", o.bytes, "bytes per test write")->check(CLI::Range(1, 1 << 30));
  app.add_option("--pin", o.pin, "bytes a job will register (memlock check), default 64 MiB")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 50));
  app.add_flag("--local", local_only, "local checks only, no peer");
  app.add_option("--out_json_file", json_file, "also write the findings as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "gradlane_doctor: " << e.what() << "\nRun with --help for the options.\n";
    return 1;
  }
  o.device.name = !device_name.empty() ? device_name : env("GRADLANE_DEVICE").value_or("");
  if (gid_index >= 0) {
    o.device.gid_index = gid_index;
  } else if (auto g = env("GRADLANE_GID_INDEX")) {
    o.device.gid_index = std::atoi(g->c_str());
  }
  o.device.port = static_cast<std::uint8_t>(ib_port);
  if (!json_file.empty()) o.json_file = json_file;

  std::cout << "gradlane_doctor " << GRADLANE_PERF_VERSION << ": RDMA readiness and connectivity\n"
            << gradlane::perf::kResultLine << std::flush;
  Report report;
  try {
    auto device = check_local(o, report);
    if (device && !local_only) check_peer(o, *device, report);
  } catch (const std::exception& e) {
    report.add(Status::fail, "doctor", e.what(), "unexpected: please report it with this output");
  }
  std::cout << gradlane::perf::kResultLine << report.summary() << '\n';
  if (o.json_file) {
    auto j = report.to_json();
    j["tool"] = "gradlane_doctor";
    j["role"] = local_only ? "local" : o.peer.empty() ? "server" : "client";
    try {
      gradlane::perf::write_json_file(*o.json_file, j);
    } catch (const std::exception& e) {
      std::cerr << "gradlane_doctor: " << e.what() << '\n';
      return 1;
    }
  }
  return report.failed() ? 1 : 0;
}
