#include "hosts.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gradlane::testing {

std::vector<Host> hosts_from_env() {
  std::vector<Host> hosts;
  const char* text = std::getenv("GRADLANE_HOSTS");
  if (text == nullptr) throw std::runtime_error("GRADLANE_HOSTS unset: run under `ci/softroce.sh --hosts 3`");
  std::istringstream in(text);
  std::string pair;
  while (in >> pair) {
    const auto comma = pair.find(',');
    hosts.push_back({pair.substr(0, comma), pair.substr(comma + 1)});
  }
  return hosts;
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

}  // namespace gradlane::testing
