// Validation of one entry from an application, before anything in it is believed.
//
// Pure functions of the copied entry and the app's attach arguments, so every malformed-entry
// case is a one-line unit test. The daemon answers a failed check with an error grant to that
// app alone and carries on; nothing is scheduled for it.
#pragma once

#include <cstdint>
#include <optional>

#include "gradlane/sidecar.hpp"
#include "sidecar/shm/layout.hpp"

namespace gradlane::sidecar {

struct AppLimits {
  std::uint32_t job = 0;
  std::uint32_t endpoint = 0;
  std::uint64_t region_bytes = 0;
  std::uint64_t max_update_bytes = 0;
};

// Format, operation and reserved fields (any operation).
std::optional<Reason> check_envelope(const shm::AppEntry& entry);
// A submit entry's body, against the app's attach arguments.
std::optional<Reason> check_submit(const shm::AppEntry& entry, const AppLimits& limits);
// A complete / complete_aggregate entry's body.
std::optional<Reason> check_complete(const shm::AppEntry& entry);
// An Applied entry: only from the app attached as that receiver's endpoint, for its job.
std::optional<Reason> check_applied(const shm::AppEntry& entry, const AppLimits& limits);

}  // namespace gradlane::sidecar
