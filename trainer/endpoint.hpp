#pragma once

#include <gradlane/ps.hpp>

#include <stdexcept>
#include <string>

namespace gradlane::trainer {

// "ADDRESS:PORT" → Endpoint; throws std::invalid_argument naming the text otherwise.
inline ps::Endpoint parse_endpoint(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw std::invalid_argument("'" + text + "' is not ADDRESS:PORT");
  }
  const unsigned long port = std::stoul(text.substr(colon + 1));
  if (port == 0 || port > 65535) throw std::invalid_argument("'" + text + "': port out of range");
  return {text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

}  // namespace gradlane::trainer
