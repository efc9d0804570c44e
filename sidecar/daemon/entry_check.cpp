#include "sidecar/daemon/entry_check.hpp"

#include <cmath>

namespace gradlane::sidecar {

std::optional<Reason> check_envelope(const shm::AppEntry& entry) {
  if (entry.format != shm::kEntryFormat) return Reason::bad_format;
  switch (entry.op) {
    case shm::Op::submit:
    case shm::Op::complete:
    case shm::Op::complete_aggregate:
    case shm::Op::applied:
      break;
    default:
      return Reason::bad_format;
  }
  const std::uint8_t known = entry.op == shm::Op::submit ? shm::kSubmitDirectOnly : 0;
  if ((entry.flags & ~known) != 0) return Reason::unknown_fields;
  return std::nullopt;
}

std::optional<Reason> check_submit(const shm::AppEntry& entry, const AppLimits& limits) {
  const auto& s = entry.body.submit;
  if (entry.job != limits.job) return Reason::unknown_job;
  if (s.bytes == 0 || s.bytes > limits.max_update_bytes) return Reason::bad_size;
  // Written so that no sum can overflow: offset first, then the room left after it.
  if (s.region_offset > limits.region_bytes || s.bytes > limits.region_bytes - s.region_offset) {
    return Reason::bad_offset;
  }
  if (!std::isfinite(s.gradient_norm) || s.gradient_norm < 0.0F) return Reason::bad_value;
  if (s.receiver == limits.endpoint) return Reason::bad_receiver;
  return std::nullopt;
}

std::optional<Reason> check_applied(const shm::AppEntry& entry, const AppLimits& limits) {
  const auto& a = entry.body.applied;
  if (a.reserved0 != 0) return Reason::unknown_fields;
  for (const std::uint64_t r : a.reserved) {
    if (r != 0) return Reason::unknown_fields;
  }
  if (entry.job != limits.job) return Reason::unknown_job;
  // Only the server's own app speaks for its sequence.
  if (a.receiver != limits.endpoint) return Reason::bad_receiver;
  return std::nullopt;
}

std::optional<Reason> check_complete(const shm::AppEntry& entry) {
  const auto& c = entry.body.complete;
  for (const std::uint64_t r : c.reserved) {
    if (r != 0) return Reason::unknown_fields;
  }
  if (c.failed > 1) return Reason::bad_value;
  return std::nullopt;
}

}  // namespace gradlane::sidecar
