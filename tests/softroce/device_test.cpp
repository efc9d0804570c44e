// Device discovery and selection over the real rxe device.
#include <gtest/gtest.h>

#include "harness.hpp"

namespace gradlane::testing {
namespace {

TEST(SoftRoceDevice, OpensByNameAndPicksTheIpv4RoceV2Gid) {
  const auto env = softroce_env();
  const Device device = Device::open(selector_from_env());
  const DeviceInfo& info = device.info();
  EXPECT_EQ(info.name, env.device);
  EXPECT_EQ(info.link_layer, "Ethernet");
  EXPECT_EQ(info.port_state, "ACTIVE");
  EXPECT_EQ(info.gid_type, "RoCE v2");
  EXPECT_EQ(info.gid_index, env.gid_index) << "automatic GID choice differs from the harness's";
  EXPECT_EQ(info.ipv4_address, env.address);
  EXPECT_GE(info.active_mtu, 256u);
  const auto names = Device::list();
  EXPECT_NE(std::find(names.begin(), names.end(), env.device), names.end());
}

TEST(SoftRoceDevice, ExplicitGidIndexIsHonoured) {
  const auto env = softroce_env();
  DeviceSelector s = selector_from_env();
  s.gid_index = env.gid_index;
  EXPECT_EQ(Device::open(s).info().gid_index, env.gid_index);
  // Index 0 is rxe's link-local fe80:: GID: usable for raw verbs, but it has no IPv4 address.
  s.gid_index = 0;
  const Device link_local = Device::open(s);
  EXPECT_TRUE(link_local.info().ipv4_address.empty());
  EXPECT_EQ(link_local.info().gid.substr(0, 4), "fe80");
}

TEST(SoftRoceDevice, UnknownDeviceNamesTheOnesPresent) {
  const auto env = softroce_env();
  DeviceSelector s;
  s.name = "mlx5_9";
  try {
    Device::open(s);
    FAIL() << "opened a device that does not exist";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::device_not_found);
    EXPECT_NE(std::string(e.what()).find("mlx5_9"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(env.device), std::string::npos) << e.what();
  }
}

TEST(SoftRoceDevice, MissingGidIndexListsTheTable) {
  DeviceSelector s = selector_from_env();
  s.gid_index = 900;
  try {
    Device::open(s);
    FAIL() << "GID 900 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::no_usable_gid);
    EXPECT_NE(std::string(e.what()).find("RoCE v2"), std::string::npos) << e.what();
  }
}

TEST(SoftRoceDevice, ListenerOnAnAddressOfAnotherDeviceIsRefused) {
  const Device device = Device::open(selector_from_env());
  try {
    Listener listener(device, 0, test_options(), "127.0.0.1");
    FAIL() << "listened on 127.0.0.1 through " << device.info().name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradlane::testing
