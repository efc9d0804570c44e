// Endpoint::parse: pure, in gradlane_ps_core so the unit tests run it without verbs.
#include <fmt/format.h>

#include <charconv>
#include <string>
#include <string_view>

#include "gradlane/ps/worker.hpp"

namespace gradlane::ps {

Endpoint Endpoint::parse(std::string_view text) {
  const auto colon = text.rfind(':');
  unsigned port = 0;
  const char* digits = text.data() + (colon == std::string_view::npos ? text.size() : colon + 1);
  const auto [end, ec] = std::from_chars(digits, text.data() + text.size(), port);
  if (colon == std::string_view::npos || colon == 0 || ec != std::errc() || end != text.data() + text.size() ||
      port == 0 || port > 65535) {
    throw Error(Errc::invalid_argument, fmt::format("'{}' is not ADDRESS:PORT (e.g. 198.18.0.10:7900)", text));
  }
  return {std::string(text.substr(0, colon)), static_cast<std::uint16_t>(port)};
}

}  // namespace gradlane::ps
