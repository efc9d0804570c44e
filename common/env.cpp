#include "common/env.hpp"

#include <charconv>
#include <cstdlib>
#include <fmt/format.h>

#include "gradlane/error.hpp"

namespace gradlane::detail {

Getenv env_or_process(const Getenv& getenv) {
  if (getenv) return getenv;
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
}

std::optional<std::uint64_t> env_integer(const Getenv& getenv, const char* name, std::uint64_t min, std::uint64_t max) {
  const auto text = getenv(name);
  if (!text) return std::nullopt;
  std::uint64_t value = 0;
  const char* first = text->data();
  const char* last = first + text->size();
  auto [end, ec] = std::from_chars(first, last, value);
  if (text->empty() || ec != std::errc() || end != last || value < min || value > max) {
    throw Error(Errc::invalid_argument,
                fmt::format("{}='{}' is not valid: expected an integer in [{}, {}]", name, *text, min, max));
  }
  return value;
}

}  // namespace gradlane::detail
