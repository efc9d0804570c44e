#include "harness.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace gradlane::testing {

SoftRoceEnv softroce_env() {
  const char* device = std::getenv("GRADLANE_DEVICE");
  const char* gid = std::getenv("GRADLANE_GID_INDEX");
  const char* addr = std::getenv("GRADLANE_ADDR");
  if (!device || !gid || !addr) {
    throw std::runtime_error(
        "GRADLANE_DEVICE, GRADLANE_GID_INDEX and GRADLANE_ADDR are not set: the softroce suite runs over a real "
        "Soft-RoCE device — start it with `ci/softroce.sh -- <this binary>`");
  }
  return {device, std::atoi(gid), addr};
}

DeviceSelector selector_from_env() {
  const auto env = softroce_env();
  DeviceSelector s;
  s.name = env.device;
  return s;  // GID index left automatic: the device test checks auto-selection finds env.gid_index
}

TransportOptions test_options() {
  TransportOptions o;
  o.connect_timeout = 20s;
  return o;
}

namespace {
std::vector<std::string> peer_argv(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"/proc/self/exe", "--peer"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}
}  // namespace

PeerProcess::PeerProcess(const std::vector<std::string>& args, const std::string& output_prefix)
    : ExternalProcess(peer_argv(args), output_prefix) {}

void PeerTest::SetUp() { device.emplace(Device::open(selector_from_env())); }

void PeerTest::start_peer(std::size_t region_bytes, const TransportOptions& options) {
  listener.emplace(*device, 0, options);
  peer.emplace(
      std::vector<std::string>{listener->address(), std::to_string(listener->port()), std::to_string(region_bytes)});
  conn.emplace(listener->accept(30s));
  peer_region = conn->wait_region(1, 30s);
  ASSERT_EQ(peer_region.length, region_bytes);
}

void send_text(Connection& conn, std::string_view text) { conn.send(std::as_bytes(std::span(text))); }

std::string text_of(const std::vector<std::byte>& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::string PeerTest::command(Connection& c, const std::string& text, std::chrono::milliseconds timeout) {
  send_text(c, text);
  return text_of(c.receive(timeout));
}

void PeerTest::stop_peer() {
  EXPECT_EQ(command("exit"), "bye");
  const auto status = peer->wait_exit(10s);
  ASSERT_TRUE(status.has_value()) << "peer did not exit";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "peer status " << *status;
}

}  // namespace gradlane::testing
