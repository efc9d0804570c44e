// Smoke of the perf tools over rxe: every tool as two processes (server, then a client that
// retries until the server is up), a few iterations, both JSON reports parsed and checked
// for the fields a script relies on. No timing assertions: the numbers only have to be sane.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../common/text_file.hpp"
#include "tool_process.hpp"

namespace gradlane::perf_testing {
namespace {

using namespace std::chrono_literals;
using gradlane::testing::read_text_file;
using nlohmann::json;

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    ADD_FAILURE() << name << " is not set: run this suite over Soft-RoCE (ci/softroce.sh -- "
                  << "this binary)";
    return {};
  }
  return v;
}

struct Pair {
  json server, client;
  std::string server_out, client_out;
};

// Runs `tool` as server and client with the same `args`, waits for both, returns both JSONs.
Pair run_pair(const std::string& tool, const std::string& name, std::vector<std::string> args, int port) {
  const std::string dir = scratch_dir(name);
  const std::string address = env_or_fail("GRADLANE_ADDR");
  args.insert(args.end(), {"-p", std::to_string(port), "--timeout", "30"});
  auto server_args = args, client_args = args;
  server_args.insert(server_args.end(), {"--out_json_file", dir + "/server.json"});
  client_args.insert(client_args.end(), {"--out_json_file", dir + "/client.json", address});
  ToolProcess server(tool, server_args, dir + "/server");
  ToolProcess client(tool, client_args, dir + "/client");  // retries until the server listens
  const auto client_rc = client.wait(120s);
  const auto server_rc = server.wait(30s);
  Pair p;
  p.server_out = server.out();
  p.client_out = client.out();
  EXPECT_EQ(client_rc, 0) << "client stderr: " << client.err() << "\nstdout: " << p.client_out;
  EXPECT_EQ(server_rc, 0) << "server stderr: " << server.err() << "\nstdout: " << p.server_out;
  p.server = json::parse(read_text_file(dir + "/server.json"), nullptr, false);
  p.client = json::parse(read_text_file(dir + "/client.json"), nullptr, false);
  EXPECT_FALSE(p.server.is_discarded()) << "server JSON did not parse";
  EXPECT_FALSE(p.client.is_discarded()) << "client JSON did not parse";
  return p;
}

void expect_test_info(const json& j, const std::string& tool, const std::string& role) {
  ASSERT_TRUE(j.contains("test_info")) << j.dump();
  const json& info = j["test_info"];
  EXPECT_EQ(info.value("tool", ""), tool);
  EXPECT_EQ(info.value("role", ""), role);
  EXPECT_EQ(info.value("Device", ""), env_or_fail("GRADLANE_DEVICE"));
  EXPECT_EQ(info.value("GID_index", -1), std::atoi(env_or_fail("GRADLANE_GID_INDEX").c_str()));
  EXPECT_GT(info.value("Mtu", 0), 0);
  EXPECT_EQ(info.value("rdma_cm_QPs", ""), "ON");
}

// One result row per size, as asked, with positive figures.
void expect_bw_results(const json& j, std::size_t bytes, int iterations) {
  ASSERT_TRUE(j.contains("results") && j["results"].is_array() && j["results"].size() == 1) << j.dump();
  const json& r = j["results"][0];
  EXPECT_EQ(r.value("MsgSize", 0u), bytes);
  EXPECT_EQ(r.value("n_iterations", 0), iterations);
  EXPECT_GT(r.value("bw_avg", 0.0), 0.0);
  EXPECT_GE(r.value("bw_peak", 0.0), r.value("bw_avg", 0.0) * 0.99);  // the whole run is one window
  EXPECT_GT(r.value("msgRate_avg", 0.0), 0.0);
}

void expect_lat_results(const json& j, std::size_t bytes, int iterations) {
  ASSERT_TRUE(j.contains("results") && j["results"].is_array() && j["results"].size() == 1) << j.dump();
  const json& r = j["results"][0];
  EXPECT_EQ(r.value("MsgSize", 0u), bytes);
  EXPECT_EQ(r.value("n_iterations", 0), iterations);
  // Orderings such as min ≤ median ≤ max hold for any sorted array, so they cannot fail; what
  // can go wrong is the unit or the scale. A round trip over rxe takes microseconds to
  // milliseconds: a figure in nanoseconds or seconds mislabelled as µs falls outside.
  const double t_min = r.value("t_min", 0.0), t_typical = r.value("t_typical", 0.0);
  EXPECT_GT(t_min, 1.0) << "µs: faster than any RDMA round trip";
  EXPECT_LT(t_typical, 100'000.0) << "µs: a tenth of a second per 8-byte round trip";
  EXPECT_GT(r.value("t_avg", 0.0), 0.0);
  EXPECT_GE(r.value("t_stdev", -1.0), 0.0);
}

// The printed table row and the JSON come from the same figures: parse the row and compare.
void expect_table_matches_json(const std::string& out, const json& j) {
  const json& r = j["results"][0];
  const std::string first = std::to_string(r.value("MsgSize", 0u)) + " ";
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    double bytes = 0, iterations = 0, t_min = 0, t_max = 0, t_typical = 0;
    if (!(fields >> bytes >> iterations >> t_min >> t_max >> t_typical)) continue;
    EXPECT_EQ(bytes, r.value("MsgSize", 0.0)) << line;
    EXPECT_EQ(iterations, r.value("n_iterations", 0.0)) << line;
    EXPECT_NEAR(t_min, r.value("t_min", 0.0), 0.01) << line;
    EXPECT_NEAR(t_max, r.value("t_max", 0.0), 0.01) << line;
    EXPECT_NEAR(t_typical, r.value("t_typical", 0.0), 0.01) << line;
    return;
  }
  ADD_FAILURE() << "no result row in the output:\n" << out;
}

// The columns perftest prints, so one parser reads both.
void expect_table(const std::string& out, const std::string& title) {
  EXPECT_NE(out.find(title), std::string::npos) << out;
}
const std::string kBwTitle = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
const std::string kLatTitle = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]";

TEST(PerfTools, WriteBwTwoQps) {
  const Pair p = run_pair(GRADLANE_WRITE_BW, "write_bw", {"-s", "65536", "-n", "5", "-q", "2"}, 19101);
  expect_test_info(p.client, "gradlane_write_bw", "client");
  expect_test_info(p.server, "gradlane_write_bw", "server");
  EXPECT_EQ(p.client["test_info"].value("Number_of_qps", 0), 2);
  expect_bw_results(p.client, 65536, 5);
  expect_bw_results(p.server, 65536, 5);  // the server prints the client's line
  expect_table(p.client_out, kBwTitle);
}

TEST(PerfTools, ReadBw) {
  const Pair p = run_pair(GRADLANE_READ_BW, "read_bw", {"-s", "4096", "-n", "5", "--report_gbits"}, 19102);
  expect_test_info(p.client, "gradlane_read_bw", "client");
  expect_bw_results(p.client, 4096, 5);
  expect_bw_results(p.server, 4096, 5);
  EXPECT_EQ(p.client["results"][0].value("bw_unit", ""), "Gb/sec");
  EXPECT_GT(p.client["test_info"].value("Outstand_reads", 0), 0);
}

TEST(PerfTools, WriteLatBothSidesMeasure) {
  const Pair p = run_pair(GRADLANE_WRITE_LAT, "write_lat", {"-s", "8", "-n", "20", "-I", "0"}, 19103);
  expect_test_info(p.client, "gradlane_write_lat", "client");
  expect_test_info(p.server, "gradlane_write_lat", "server");
  expect_lat_results(p.client, 8, 20);
  expect_lat_results(p.server, 8, 20);
  expect_table(p.client_out, kLatTitle);
  expect_table_matches_json(p.client_out, p.client);
  // Both sides time the same ping-pong, each from its own clock: their medians agree (a side
  // that halved twice, or not at all, would be off by 2×; the 3× allows a loaded machine).
  const double client = p.client["results"][0].value("t_typical", 0.0);
  const double server = p.server["results"][0].value("t_typical", 0.0);
  EXPECT_LT(client, 3 * server) << "client " << client << " µs vs server " << server << " µs";
  EXPECT_LT(server, 3 * client) << "client " << client << " µs vs server " << server << " µs";
}

TEST(PerfTools, ReadLat) {
  const Pair p = run_pair(GRADLANE_READ_LAT, "read_lat", {"-s", "8", "-n", "20"}, 19104);
  expect_test_info(p.client, "gradlane_read_lat", "client");
  expect_lat_results(p.client, 8, 20);
  expect_lat_results(p.server, 8, 20);
}

TEST(PerfTools, DoctorAgainstADoctorPeer) {
  const std::string dir = scratch_dir("doctor");
  ToolProcess server(GRADLANE_DOCTOR, {"-p", "19105", "--timeout", "30", "--out_json_file", dir + "/server.json"},
                     dir + "/server");
  ToolProcess client(
      GRADLANE_DOCTOR,
      {"-p", "19105", "--timeout", "30", "--out_json_file", dir + "/client.json", env_or_fail("GRADLANE_ADDR")},
      dir + "/client");
  EXPECT_EQ(client.wait(60s), 0) << client.out() << client.err();
  EXPECT_EQ(server.wait(30s), 0) << server.out() << server.err();
  for (const char* side : {"client", "server"}) {
    const json j = json::parse(read_text_file(dir + "/" + side + ".json"), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << side;
    EXPECT_EQ(j.value("role", ""), side);
    EXPECT_EQ(j.value("failed", -1), 0) << j.dump(2);
    std::vector<std::string> checks;
    for (const auto& c : j["checks"]) checks.push_back(c.value("check", ""));
    for (const char* wanted :
         {"devices", "port", "GID", "memlock", "rdma_cm", "write client → server", "write server → client"}) {
      EXPECT_NE(std::find(checks.begin(), checks.end(), wanted), checks.end()) << side << " lacks " << wanted;
    }
  }
}

// ---- errors: a clear message and exit 1, never a hang ---------------------------------------

struct Outcome {
  std::optional<int> rc;
  std::string err;
};
Outcome run_alone(const std::string& tool, const std::vector<std::string>& args, const std::string& name) {
  ToolProcess p(tool, args, scratch_dir(name) + "/run");
  const auto rc = p.wait(30s);
  return {rc, p.err()};
}

TEST(PerfToolErrors, BadFlagIsExitOneWithAMessage) {
  const Outcome o = run_alone(GRADLANE_WRITE_BW, {"--no-such-flag"}, "badflag");
  EXPECT_EQ(o.rc, 1);
  EXPECT_NE(o.err.find("--no-such-flag"), std::string::npos) << o.err;
}

TEST(PerfToolErrors, UnknownDeviceNamesTheDevicesPresent) {
  const Outcome o = run_alone(GRADLANE_READ_LAT, {"-d", "nosuch0", "--timeout", "5"}, "baddevice");
  EXPECT_EQ(o.rc, 1);
  EXPECT_NE(o.err.find("nosuch0"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find(env_or_fail("GRADLANE_DEVICE")), std::string::npos) << o.err;
}

TEST(PerfToolErrors, ServerWithoutClientTimesOut) {
  const Outcome o = run_alone(GRADLANE_WRITE_LAT, {"-p", "19106", "--timeout", "2"}, "lonely");
  EXPECT_EQ(o.rc, 1);  // not a hang: the wait above would have killed it (rc nullopt)
  EXPECT_NE(o.err.find("timeout"), std::string::npos) << o.err;
}

}  // namespace
}  // namespace gradlane::perf_testing
