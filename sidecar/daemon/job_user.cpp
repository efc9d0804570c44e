// gradlaned --job-user JOB:USER (daemon_config.hpp): the daemon's flag and the tests' child
// daemons read it alike.
#include <pwd.h>

#include <charconv>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gradlane/error.hpp"
#include "sidecar/daemon/daemon_config.hpp"

namespace gradlane::sidecar {

// --job-user JOB:USER, USER a name (its primary group too) or a numeric uid (group = uid).
DaemonConfig::JobSegment parse_job_user(const std::string& text) {
  const auto colon = text.find(':');
  std::uint32_t job = 0;
  const std::string_view all(text);
  const auto job_part = all.substr(0, colon == std::string::npos ? 0 : colon);
  const auto [end, ec] = std::from_chars(job_part.data(), job_part.data() + job_part.size(), job);
  const std::string user = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (job_part.empty() || ec != std::errc{} || end != job_part.data() + job_part.size() || user.empty()) {
    throw Error(Errc::invalid_argument,
                          fmt::format("--job-user '{}': expected JOB:USER, a job number and a user name or uid "
                                      "(e.g. 7:alice or 7:1001)", text));
  }
  if (const passwd* pw = ::getpwnam(user.c_str())) {
    return {job, static_cast<std::uint32_t>(pw->pw_uid)};
  }
  std::uint32_t uid = 0;
  const auto [uid_end, uid_ec] = std::from_chars(user.data(), user.data() + user.size(), uid);
  if (uid_ec != std::errc{} || uid_end != user.data() + user.size()) {
    throw Error(Errc::invalid_argument,
                          fmt::format("--job-user '{}': there is no user '{}' on this host (give a user name from "
                                      "/etc/passwd or a numeric uid)", text, user));
  }
  return {job, uid};
}

}  // namespace gradlane::sidecar
