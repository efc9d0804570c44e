// What a policy's refusals and drops become for the application: each reason survives the trip
// through the daemon's queues, with the part's bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "harness.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kUnreachable = 21, kUnknown = 22, kLostMidway = 9;

// Refuses receiver 21 as unreachable (its owner is a lost peer) and 22 as unknown; answers
// every other request with two peer_lost drops, the way DistributedPolicy does when a peer
// that had decided nothing of a 2-part request is lost.
class ScriptedPolicy final : public sched::Policy {
 public:
  sched::SubmitStatus submit(const sched::Request& r, sched::Instant) override {
    if (r.receiver == sched::EndpointId{kUnreachable}) return sched::SubmitStatus::receiver_unreachable;
    if (r.receiver == sched::EndpointId{kUnknown}) return sched::SubmitStatus::unknown_receiver;
    pending_.push_back(r);
    return sched::SubmitStatus::accepted;
  }
  void schedule(sched::Instant, std::vector<sched::Outcome>& out) override {
    for (const auto& r : pending_) {
      out.emplace_back(sched::Drop{r.id, 0, 2, 0, 3000, r.job, r.sender, r.receiver, sched::DropReason::peer_lost, 0});
      out.emplace_back(
          sched::Drop{r.id, 1, 2, 3000, r.bytes - 3000, r.job, r.sender, r.receiver, sched::DropReason::peer_lost, 0});
    }
    pending_.clear();
  }
  bool complete(sched::TransferId, sched::Instant, sched::Nanos, sched::TransferResult) override { return false; }
  bool replica_ack(sched::EndpointId, sched::Seq) override { return false; }
  std::optional<sched::Instant> next_wakeup() const override { return std::nullopt; }
  bool take_over(sched::EndpointId, sched::Version, sched::JobId, sched::Instant) override { return false; }

 private:
  std::vector<sched::Request> pending_;
};

TEST(SidecarRouting, UnreachableAndUnknownReceiversAreErrorsAndPeerLossIsNotStaleness) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name), std::make_unique<ScriptedPolicy>());
  Client app = Client::attach(test_attach(name));

  Update u = small_update();
  u.receiver = kUnreachable;
  const auto unreachable = app.request(u);
  Grant g = app.wait(2s);
  EXPECT_EQ(g.request, unreachable);
  EXPECT_EQ(g.kind, GrantKind::error);
  EXPECT_EQ(g.reason, Reason::receiver_unreachable);

  u.receiver = kUnknown;
  const auto unknown = app.request(u);
  g = app.wait(2s);
  EXPECT_EQ(g.request, unknown);
  EXPECT_EQ(g.kind, GrantKind::error);
  EXPECT_EQ(g.reason, Reason::unknown_receiver);

  u.receiver = kLostMidway;
  u.bytes = 5000;
  const auto lost = app.request(u);
  for (std::uint32_t part = 0; part < 2; ++part) {
    g = app.wait(2s);
    EXPECT_EQ(g.request, lost);
    EXPECT_EQ(g.kind, GrantKind::drop);
    EXPECT_EQ(g.reason, Reason::peer_lost) << "a peer loss must not tell the app its model is stale";
    EXPECT_EQ(g.part_index, part);
    EXPECT_EQ(g.part_count, 2U);
    EXPECT_EQ(g.part_offset, part == 0 ? 0U : 3000U);
    EXPECT_EQ(g.part_bytes, part == 0 ? 3000U : 2000U);
  }
  EXPECT_EQ(app.outstanding(), 0U) << "the drops answered the request completely";
  EXPECT_EQ(reason_name(Reason::peer_lost), "peer_lost");
  EXPECT_EQ(reason_name(Reason::receiver_unreachable), "receiver_unreachable");
  EXPECT_EQ(reason_name(Reason::unknown_receiver), "unknown_receiver");
  EXPECT_EQ(reason_name(Reason::unknown_endpoint), "unknown_endpoint");
}

}  // namespace
}  // namespace gradlane::sidecar::test
