// The softroce suite: GoogleTest in the test role, or the peer (`--peer ...`) it spawns.
#include <cstring>

#include <gtest/gtest.h>

#include "harness.hpp"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--peer") == 0) return gradlane::testing::peer_main(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
