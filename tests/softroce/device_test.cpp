// Device discovery and selection over the real rxe device.
#include <cstdlib>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "harness.hpp"

namespace gradlane::testing {
namespace {

// Sets (or, with nullopt, unsets) an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(SoftRoceDevice, OpensByNameAndPicksTheIpv4RoceV2Gid) {
  const auto env = softroce_env();
  const DeviceSelector selector = selector_from_env();
  // The harness exports GRADLANE_GID_INDEX, which Device::open honours: hide it so the
  // automatic choice is what is tested.
  const ScopedEnv automatic("GRADLANE_GID_INDEX", std::nullopt);
  const Device device = Device::open(selector);
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

TEST(SoftRoceDevice, GidIndexFromTheEnvironmentIsHonoured) {
  // The connect errors tell users to set GRADLANE_GID_INDEX: the library must read it.
  const auto env = softroce_env();
  {
    const ScopedEnv link_local("GRADLANE_GID_INDEX", "0");  // rxe's fe80:: GID, never the automatic choice
    const Device device = Device::open(selector_from_env());
    EXPECT_EQ(device.info().gid_index, 0);
    EXPECT_EQ(device.info().gid.substr(0, 4), "fe80");
    DeviceSelector explicit_index = selector_from_env();
    explicit_index.gid_index = env.gid_index;  // an explicit index wins over the environment
    EXPECT_EQ(Device::open(explicit_index).info().gid_index, env.gid_index);
  }
  {
    const ScopedEnv malformed("GRADLANE_GID_INDEX", "one");
    try {
      Device::open(selector_from_env());
      FAIL() << "GRADLANE_GID_INDEX=one accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("GRADLANE_GID_INDEX='one'"), std::string::npos) << e.what();
    }
  }
  {
    const ScopedEnv absent("GRADLANE_GID_INDEX", "200");
    try {
      Device::open(selector_from_env());
      FAIL() << "GRADLANE_GID_INDEX=200 accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::no_usable_gid);
      EXPECT_NE(std::string(e.what()).find("from GRADLANE_GID_INDEX"), std::string::npos) << e.what();
    }
  }
}

TEST(SoftRoceDevice, SelectorFromEnvReadsDeviceAndGidIndex) {
  const auto fake = [](const char* name) -> std::optional<std::string> {
    if (std::string(name) == "GRADLANE_DEVICE") return "rxe7";
    if (std::string(name) == "GRADLANE_GID_INDEX") return "3";
    return std::nullopt;
  };
  const DeviceSelector s = DeviceSelector::from_env(fake);
  EXPECT_EQ(s.name, "rxe7");
  EXPECT_EQ(s.gid_index, 3);
  const DeviceSelector none = DeviceSelector::from_env([](const char*) { return std::optional<std::string>(); });
  EXPECT_EQ(none.name, "");
  EXPECT_EQ(none.gid_index, -1);
  EXPECT_THROW(DeviceSelector::from_env([](const char*) { return std::optional<std::string>("-1"); }), Error);
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
