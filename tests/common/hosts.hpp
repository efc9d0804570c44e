// What multi-host softroce tests share: the emulated hosts `ci/softroce.sh --hosts N` made, and
// the JSON-lines files the processes under test write.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradlane::testing {

struct Host {
  std::string device, address;
};

// From GRADLANE_HOSTS ("rxe0,198.18.0.10 rxe1,198.18.0.11 …"); throws when it is unset.
std::vector<Host> hosts_from_env();

// One JSON object per non-empty line.
std::vector<nlohmann::json> read_lines(const std::string& path);

}  // namespace gradlane::testing
