// A whole file as a string, for tests that read what a program wrote; empty if it cannot be
// opened (the assertion that follows says what was expected).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace gradlane::testing {

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace gradlane::testing
