// Endpoint::parse, which every program and the Python package read ADDRESS:PORT with: the
// address is everything before the last colon, the port all digits after it, in 1..65535.
#include <gtest/gtest.h>

#include <string>

#include "gradlane/ps.hpp"

namespace gradlane::ps {
namespace {

TEST(Endpoint, ParsesAddressAndPort) {
  const Endpoint e = Endpoint::parse("198.18.0.10:7900");
  EXPECT_EQ(e.address, "198.18.0.10");
  EXPECT_EQ(e.port, 7900);
  // The last colon splits: an IPv6 address keeps its own.
  const Endpoint v6 = Endpoint::parse("fd00::1:65535");
  EXPECT_EQ(v6.address, "fd00::1");
  EXPECT_EQ(v6.port, 65535);
}

TEST(Endpoint, RefusesWhatIsNotAddressColonPortAndNamesIt) {
  for (const std::string bad : {"198.18.0.10", ":7900", "host:", "host:0", "host:65536", "host:79x0", "host:-1",
                                "host: 7900", "host:99999999999"}) {
    try {
      (void)Endpoint::parse(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << bad;
      EXPECT_NE(std::string(e.what()).find("'" + bad + "' is not ADDRESS:PORT"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace gradlane::ps
