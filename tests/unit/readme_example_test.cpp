// The README shows examples/push_update.cpp and docs/parameter-server.md shows
// examples/ps_quickstart.cpp; this keeps each page's block identical to its file so the example a
// reader copies is the one the softroce suite compiles and runs.
#include <gtest/gtest.h>

#include "../common/text_file.hpp"

namespace {

using gradlane::testing::read_text_file;

TEST(Readme, EmbeddingExampleIsExamplesPushUpdateVerbatim) {
  const std::string readme = read_text_file(GRADLANE_SOURCE_DIR "/README.md");
  const std::string example = read_text_file(GRADLANE_SOURCE_DIR "/examples/push_update.cpp");
  ASSERT_FALSE(example.empty());
  const std::string fence = "```cpp\n// Push one 4 MiB gradient update";
  const auto start = readme.find(fence);
  ASSERT_NE(start, std::string::npos) << "README has no embedding example block";
  const auto body = start + std::string("```cpp\n").size();
  const auto end = readme.find("```", body);
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(readme.substr(body, end - body), example) << "README example drifted from examples/push_update.cpp";
}

TEST(Docs, ParameterServerPageExampleIsExamplesPsQuickstartVerbatim) {
  const std::string page = read_text_file(GRADLANE_SOURCE_DIR "/docs/parameter-server.md");
  const std::string example = read_text_file(GRADLANE_SOURCE_DIR "/examples/ps_quickstart.cpp");
  ASSERT_FALSE(example.empty());
  const auto start = page.find("```cpp\n// A parameter server, its replica and a worker");
  ASSERT_NE(start, std::string::npos) << "docs/parameter-server.md has no parameter-server example block";
  const auto body = start + std::string("```cpp\n").size();
  const auto end = page.find("```", body);
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(page.substr(body, end - body), example)
      << "docs/parameter-server.md example drifted from examples/ps_quickstart.cpp";
}

}  // namespace
