// A peer whose host goes silent (no process exit, so no rdma_cm disconnect from its kernel):
// only the QP's ACK timeout can tell. Needs two emulated hosts (`ci/softroce.sh --hosts 2+`):
// the peer runs on host 1, and host 1's link is made to drop every packet with netem.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <gtest/gtest.h>

#include "../common/pattern.hpp"
#include "harness.hpp"

namespace gradlane::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Runs a shell command (tc), failing the test on a non-zero exit.
void run(const std::string& command) {
  ExternalProcess p({"/bin/sh", "-c", command});
  const auto status = p.wait_exit(20s);
  ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << command;
}

// Host 1's device and netdev from GRADLANE_HOSTS ("rxe0,198.18.0.10 rxe1,198.18.0.11 ...").
std::optional<std::string> second_host_device() {
  const char* hosts = std::getenv("GRADLANE_HOSTS");
  if (hosts == nullptr) return std::nullopt;
  std::istringstream in(hosts);
  std::string first, second;
  if (!(in >> first >> second)) return std::nullopt;
  return second.substr(0, second.find(','));
}

class SilentPeer : public PeerTest {
 protected:
  void TearDown() override {
    // Never leave the link broken for the tests after this one.
    if (blackholed_) {
      ExternalProcess undo({"/bin/sh", "-c", "tc qdisc del dev h1 root; tc qdisc del dev h1-p root"});
      (void)undo.wait_exit(20s);
    }
  }
  bool blackholed_ = false;
};

TEST_F(SilentPeer, HostThatStopsAnsweringIsAnErrorWithinTheAckTimeoutBound) {
  const auto device_1 = second_host_device();
  ASSERT_TRUE(device_1.has_value()) << "needs ci/softroce.sh --hosts 2 or more";
  // The peer process opens host 1's device (its selector reads GRADLANE_DEVICE).
  const std::string own = softroce_env().device;
  ::setenv("GRADLANE_DEVICE", device_1->c_str(), 1);
  start_peer(64 * 1024);
  ::setenv("GRADLANE_DEVICE", own.c_str(), 1);
  Buffer src = Buffer::allocate(64 * 1024);
  fill_pattern(src.bytes(), 5);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  conn->wait(conn->write(mr, 0, peer_region, 0, src.size(), Signal::always), 30s);
  ASSERT_EQ(command("verify 0 65536 5"), "ok") << "the peer answers across the bridge";

  // Host 1 falls silent in both directions; its process stays alive, so no disconnect comes.
  run("tc qdisc replace dev h1 root netem loss 100% && tc qdisc replace dev h1-p root netem loss 100%");
  blackholed_ = true;
  const auto start = Clock::now();
  try {
    conn->wait(conn->write(mr, 0, peer_region, 0, src.size(), Signal::always), 20s);
    FAIL() << "a write to a silent host completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_gone) << e.what();
    EXPECT_NE(std::string(e.what()).find("no acknowledgement"), std::string::npos) << e.what();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // ACK timeout 18 (≈1.07 s) × (1 retry + 1): ≈2.1 s. Well above 0 (it was the timeout, not an
  // event) and well below NCCL's ~30 s.
  EXPECT_GT(seconds, 1.0);
  EXPECT_LT(seconds, 5.0);
  RecordProperty("silent_peer_detection_s", std::to_string(seconds));
  std::printf("silent peer detected after %.2f s\n", seconds);
}

}  // namespace
}  // namespace gradlane::testing
