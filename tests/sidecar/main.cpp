// gradlane_sidecar_tests: GoogleTest, plus the child roles the tests spawn (`--child=<role>`).
#include <gtest/gtest.h>

#include <string_view>

#include "harness.hpp"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with("--child=")) return gradlane::sidecar::test::run_child(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
