#include <gtest/gtest.h>

#include <map>

#include "gradlane/options.hpp"
#include "device/gid.hpp"

namespace gradlane {
namespace {

using detail::GidEntry;
using detail::GidType;

std::array<std::uint8_t, 16> ipv4_gid(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d};
}
std::array<std::uint8_t, 16> link_local() { return {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}; }

TEST(Gid, Ipv4MappedAddressIsExtracted) {
  EXPECT_EQ(detail::gid_ipv4(ipv4_gid(198, 18, 0, 1)), "198.18.0.1");
  EXPECT_EQ(detail::gid_ipv4(link_local()), std::nullopt);
  EXPECT_EQ(detail::gid_text(ipv4_gid(198, 18, 0, 1)), "0000:0000:0000:0000:0000:ffff:c612:0001");
}

TEST(Gid, RxeTablePicksIndexOne) {
  // rxe: [0] fe80:: RoCE v2, [1] ::ffff:198.18.0.1 RoCE v2.
  const std::vector<GidEntry> table{{0, GidType::roce_v2, link_local()},
                                    {1, GidType::roce_v2, ipv4_gid(198, 18, 0, 1)}};
  EXPECT_EQ(detail::choose_gid_index(table, true), 1);
}

TEST(Gid, Mlx5TablePrefersRoceV2OverV1) {
  // mlx5 lists each address as v1 then v2: [0] fe80 v1, [1] fe80 v2, [2] ipv4 v1, [3] ipv4 v2.
  const std::vector<GidEntry> table{{0, GidType::roce_v1, link_local()},
                                    {1, GidType::roce_v2, link_local()},
                                    {2, GidType::roce_v1, ipv4_gid(10, 0, 0, 5)},
                                    {3, GidType::roce_v2, ipv4_gid(10, 0, 0, 5)}};
  EXPECT_EQ(detail::choose_gid_index(table, true), 3);
}

TEST(Gid, FallsBackToAnyRoceV2AndFailsWithoutOne) {
  EXPECT_EQ(detail::choose_gid_index({{0, GidType::roce_v1, link_local()}, {4, GidType::roce_v2, link_local()}}, true),
            4);
  EXPECT_EQ(detail::choose_gid_index({{0, GidType::roce_v1, ipv4_gid(1, 2, 3, 4)}}, true), std::nullopt);
  EXPECT_EQ(detail::choose_gid_index({}, true), std::nullopt);
}

TEST(Gid, InfinibandUsesIndexZero) { EXPECT_EQ(detail::choose_gid_index({{0, GidType::ib, link_local()}}, false), 0); }

struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::optional<std::string> operator()(const char* name) const {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
};

TEST(Options, DefaultsAreValidAndDocumented) {
  const TransportOptions o = TransportOptions::from_env(FakeEnv{{{"GRADLANE_JOB_KEY", "k"}}});
  EXPECT_EQ(o.ack_timeout, 18);
  EXPECT_EQ(o.retry_count, 1);
  EXPECT_EQ(o.signal_interval, 32u);
  EXPECT_EQ(o.type_of_service, 0) << "not set unless asked";
  EXPECT_NO_THROW(o.validate());
}

TEST(Options, EnvironmentOverrides) {
  const TransportOptions o = TransportOptions::from_env(FakeEnv{{{"GRADLANE_ACK_TIMEOUT", "20"},
                                                                 {"GRADLANE_RETRY_COUNT", "7"},
                                                                 {"GRADLANE_CONNECT_TIMEOUT_MS", "250"},
                                                                 {"GRADLANE_SQ_DEPTH", "1024"},
                                                                 {"GRADLANE_SIGNAL_INTERVAL", "100"},
                                                                 {"GRADLANE_MAX_PENDING_ACCEPTS", "3"},
                                                                 {"GRADLANE_TOS", "8"},
                                                                 {"GRADLANE_JOB_KEY", "k"}}});
  EXPECT_EQ(o.ack_timeout, 20);
  EXPECT_EQ(o.retry_count, 7);
  EXPECT_EQ(o.connect_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(o.send_queue_depth, 1024u);
  EXPECT_EQ(o.signal_interval, 100u);
  EXPECT_EQ(o.max_pending_accepts, 3u);
  EXPECT_EQ(o.type_of_service, 8);
}

TEST(Options, MalformedValuesNameTheVariable) {
  for (const auto& [name, value] : std::map<std::string, std::string>{{"GRADLANE_ACK_TIMEOUT", "fast"},
                                                                      {"GRADLANE_ACK_TIMEOUT", "32"},
                                                                      {"GRADLANE_RETRY_COUNT", "-1"},
                                                                      {"GRADLANE_SQ_DEPTH", "12abc"},
                                                                      {"GRADLANE_MAX_MESSAGE", ""},
                                                                      {"GRADLANE_MAX_PENDING_ACCEPTS", "0"},
                                                                      {"GRADLANE_TOS", "256"}}) {
    try {
      TransportOptions::from_env(FakeEnv{{{name, value}}});
      FAIL() << name << "=" << value << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST(Options, SignalIntervalMustLeaveASignalledRequestInAFullQueue) {
  TransportOptions o;
  o.send_queue_depth = 64;
  o.signal_interval = 33;
  EXPECT_THROW(o.validate(), Error);
  o.signal_interval = 32;
  EXPECT_NO_THROW(o.validate());
  EXPECT_THROW(TransportOptions::from_env(FakeEnv{{{"GRADLANE_SQ_DEPTH", "16"}}}), Error)
      << "default interval 32 > 16/2";
}

}  // namespace
}  // namespace gradlane
