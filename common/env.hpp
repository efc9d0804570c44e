// Internal: reading GRADLANE_* environment variables, one parser for every knob so each
// malformed value is refused the same way (an Error naming the variable and the valid range).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace gradlane::detail {

using Getenv = std::function<std::optional<std::string>(const char*)>;

// `getenv` itself, or the process environment when it is empty.
Getenv env_or_process(const Getenv& getenv);
// The variable's integer value, nullopt when unset; throws Error(invalid_argument) naming the
// variable when it is not an integer in [min, max].
std::optional<std::uint64_t> env_integer(const Getenv& getenv, const char* name, std::uint64_t min, std::uint64_t max);

}  // namespace gradlane::detail
