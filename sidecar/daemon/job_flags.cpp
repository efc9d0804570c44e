// gradlaned's flags that name a job, --job-user JOB:USER and --standby ENDPOINT:JOB
// (daemon_config.hpp): the daemon's flags and the tests' child daemons read them alike.
#include <pwd.h>

#include <charconv>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gradlane/error.hpp"
#include "sidecar/daemon/daemon_config.hpp"

namespace gradlane::sidecar {
namespace {

// A whole decimal number, or nullopt.
std::optional<std::uint32_t> number(std::string_view text) {
  std::uint32_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

// --job-user JOB:USER, USER a name (its primary group too) or a numeric uid (group = uid).
DaemonConfig::JobSegment parse_job_user(const std::string& text) {
  const auto colon = text.find(':');
  const std::string_view all(text);
  const auto job = number(all.substr(0, colon == std::string::npos ? 0 : colon));
  const std::string user = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (!job || user.empty()) {
    throw Error(Errc::invalid_argument,
                fmt::format("--job-user '{}': expected JOB:USER, a job number and a user name or uid "
                            "(e.g. 7:alice or 7:1001)",
                            text));
  }
  if (const passwd* pw = ::getpwnam(user.c_str())) {
    return {*job, static_cast<std::uint32_t>(pw->pw_uid)};
  }
  const auto uid = number(user);
  if (!uid) {
    throw Error(Errc::invalid_argument,
                fmt::format("--job-user '{}': there is no user '{}' on this host (give a user name from "
                            "/etc/passwd or a numeric uid)",
                            text, user));
  }
  return {*job, *uid};
}

// --standby ENDPOINT:JOB.
DaemonConfig::Standby parse_standby(const std::string& text) {
  const auto colon = text.find(':');
  const std::string_view all(text);
  const auto endpoint = number(all.substr(0, colon == std::string::npos ? all.size() : colon));
  const auto job = colon == std::string::npos ? std::nullopt : number(all.substr(colon + 1));
  if (!endpoint || !job) {
    throw Error(Errc::invalid_argument,
                fmt::format("--standby '{}': expected ENDPOINT:JOB, the server's endpoint and the job whose replica "
                            "runs here (e.g. 0:7): only that job's promoted replica may take the sequence over",
                            text));
  }
  return {*endpoint, *job};
}

}  // namespace gradlane::sidecar
