// Receivers: who speaks for each receiver endpoint at a gradlaned — its server app, the job that
// owns it while that app is gone, its grant key, and a dead daemon's survivors held.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "gradlane/sidecar.hpp"
#include "sidecar/daemon/receivers.hpp"

namespace gradlane::sidecar {
namespace {

TEST(Receivers, AJobOwnsItsEndpointUntilItsServerDetachesNotWhenItDies) {
  Receivers receivers;
  EXPECT_FALSE(receivers.owned_by_another(4, 1)) << "nobody's yet";
  receivers.seat(4, /*job=*/1, /*slot=*/7, std::nullopt);
  EXPECT_TRUE(receivers.owned_by_another(4, 2));
  EXPECT_FALSE(receivers.owned_by_another(4, 1));
  EXPECT_EQ(receivers.server_slot(4), 7u);
  EXPECT_EQ(receivers.server_slot(4, 1), 7u);
  EXPECT_EQ(receivers.server_slot(4, 2), std::nullopt) << "not job 2's server";

  EXPECT_FALSE(receivers.unseat(4, /*slot=*/8, /*detached=*/true)) << "slot 8 is not its server";
  EXPECT_TRUE(receivers.unseat(4, 7, /*detached=*/false)) << "its server died";
  EXPECT_EQ(receivers.server_slot(4), std::nullopt);
  EXPECT_TRUE(receivers.owned_by_another(4, 2)) << "a dead server's job keeps its endpoint";

  receivers.seat(4, 1, 9, std::nullopt);  // it came back
  EXPECT_TRUE(receivers.unseat(4, 9, /*detached=*/true));
  EXPECT_FALSE(receivers.owned_by_another(4, 2)) << "a clean detach releases it";
}

TEST(Receivers, TheLatestServerToAttachSpeaksForItsEndpoint) {
  Receivers receivers;
  receivers.seat(4, 1, 7, std::nullopt);
  receivers.seat(4, 1, 8, std::nullopt);  // restarted in place before the old one was swept
  EXPECT_FALSE(receivers.unseat(4, 7, false)) << "the old one's sweep does not unseat the new";
  EXPECT_EQ(receivers.server_slot(4), 8u);
}

TEST(Receivers, TokensAreStampedWithTheKeyOnlyWhereThisDaemonHandsTheSequenceOut) {
  Receivers receivers;
  const sched::GrantKey key{1, 2, 3};
  EXPECT_EQ(receivers.token(4, 10, /*carried=*/55, /*hands_out=*/true), 55u) << "no key: what was carried";
  receivers.seat(4, 1, 7, key);
  EXPECT_EQ(receivers.token(4, 10, 55, true), grant_token(key, 10));
  EXPECT_EQ(receivers.token(4, 10, 55, false), 55u) << "a peer hands it out: its token";
  receivers.unseat(4, 7, false);
  EXPECT_EQ(receivers.token(4, 10, 55, true), grant_token(key, 10)) << "the key outlives its server";
  receivers.seat(4, 1, 8, std::nullopt);
  EXPECT_EQ(receivers.token(4, 10, 55, true), 55u) << "a server attached without a key drops it";
}

TEST(Receivers, OnlyTheVerySurvivorTakesItsHeldEndpointOverOnce) {
  Receivers receivers;
  const Survivor server{4, /*pid=*/100, /*start_time=*/5000, /*job=*/1};
  std::map<std::uint32_t, HeldEndpoint> held;
  held[4] = HeldEndpoint{server, /*segment=*/0};
  receivers.hold(held);
  EXPECT_FALSE(receivers.take_survivor(4, Survivor{4, 101, 5000, 1}, 0)) << "another process";
  EXPECT_FALSE(receivers.take_survivor(4, Survivor{4, 100, 5001, 1}, 0)) << "a reused pid";
  EXPECT_FALSE(receivers.take_survivor(4, Survivor{4, 100, 5000, 2}, 0)) << "another job";
  EXPECT_FALSE(receivers.take_survivor(4, server, 1)) << "through another segment";
  EXPECT_TRUE(receivers.take_survivor(4, server, 0));
  EXPECT_FALSE(receivers.take_survivor(4, server, 0)) << "once";
  EXPECT_FALSE(receivers.take_survivor(6, Survivor{6, 200, 6000, 2}, 1)) << "an endpoint not held";
}

}  // namespace
}  // namespace gradlane::sidecar
