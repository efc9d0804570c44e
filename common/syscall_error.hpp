// Internal: turning a failed system or verbs call into an Error that names the call.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "gradlane/error.hpp"

namespace gradlane::detail {

// "ibv_create_cq(rxe0, 512 entries) failed: Cannot allocate memory (errno 12)"
inline std::string call_failed(const std::string& call, int err) {
  return call + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
}

// Verbs calls return an errno value directly (or set errno and return non-zero / nullptr).
[[noreturn]] inline void throw_call_failed(Errc code, const std::string& call, int err) {
  throw Error(code, call_failed(call, err), err);
}

// For calls that return -1/nullptr and set errno; some verbs providers leave errno at 0.
inline int last_errno_or(int fallback) { return errno != 0 ? errno : fallback; }

}  // namespace gradlane::detail
