// Soft-RoCE test harness: the device the VM set up, and a peer process to talk to.
//
// Every test talks to a real second process over rxe. The peer is this same executable
// started with --peer (one exec per test: cheap next to connection setup, even under TCG). It
// connects back to the test's Listener, registers a region, advertises it as region 1, and
// then executes text commands sent as control messages (see peer.cpp), so each side checks
// the data: the test verifies what it reads, the peer verifies what the test wrote.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../common/external_process.hpp"
#include "gradlane/gradlane.hpp"

namespace gradlane::testing {

using namespace std::chrono_literals;

// Seconds of the steady clock since `t`.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// GRADLANE_DEVICE / GRADLANE_GID_INDEX / GRADLANE_ADDR, as set by ci/softroce.sh.
struct SoftRoceEnv {
  std::string device;
  int gid_index = -1;
  std::string address;
};
// Throws (failing the test, never skipping it) when not run under ci/softroce.sh.
SoftRoceEnv softroce_env();
DeviceSelector selector_from_env();

// Options for tests: generous connect timeout for a slow emulated machine.
TransportOptions test_options();

// This executable in its peer role: `/proc/self/exe --peer ARGS...`.
class PeerProcess : public ExternalProcess {
 public:
  // With an `output_prefix`, its stdout/stderr go to <prefix>.out / .err (see ExternalProcess).
  explicit PeerProcess(const std::vector<std::string>& args, const std::string& output_prefix = {});
};

// Opens the device, listens, starts a peer that connects back and advertises its region.
class PeerTest : public ::testing::Test {
 protected:
  void SetUp() override;
  // Starts the peer with a region of `region_bytes` and accepts its connection.
  void start_peer(std::size_t region_bytes, const TransportOptions& options = test_options());
  // Sends a text command to the peer over `conn` and returns its one-line reply.
  std::string command(Connection& conn, const std::string& text, std::chrono::milliseconds timeout = 60s);
  std::string command(const std::string& text) { return command(*conn, text); }
  // Sends "exit" and expects a clean exit.
  void stop_peer();

  std::optional<Device> device;
  std::optional<Listener> listener;
  std::optional<PeerProcess> peer;
  std::optional<Connection> conn;
  RegionDescriptor peer_region;
};

// Control messages as text.
void send_text(Connection& conn, std::string_view text);
std::string text_of(const std::vector<std::byte>& bytes);

int peer_main(int argc, char** argv);

}  // namespace gradlane::testing
