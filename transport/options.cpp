#include "gradlane/options.hpp"

#include <fmt/format.h>

#include "gradlane/error.hpp"
#include "transport/env.hpp"

namespace gradlane {
namespace {

template <class T>
void apply(const detail::Getenv& getenv, const char* name, std::uint64_t min, std::uint64_t max, T& field) {
  if (auto value = detail::env_integer(getenv, name, min, max)) field = static_cast<T>(*value);
}

}  // namespace

TransportOptions TransportOptions::from_env(
    const std::function<std::optional<std::string>(const char*)>& getenv_fn) {
  const auto getenv = detail::env_or_process(getenv_fn);
  TransportOptions o;
  apply(getenv, "GRADLANE_ACK_TIMEOUT", 1, 31, o.ack_timeout);
  apply(getenv, "GRADLANE_RETRY_COUNT", 0, 7, o.retry_count);
  apply(getenv, "GRADLANE_RNR_RETRY", 0, 7, o.rnr_retry);
  std::uint64_t connect_ms = static_cast<std::uint64_t>(o.connect_timeout.count());
  apply(getenv, "GRADLANE_CONNECT_TIMEOUT_MS", 1, 3'600'000, connect_ms);
  o.connect_timeout = std::chrono::milliseconds(connect_ms);
  apply(getenv, "GRADLANE_SQ_DEPTH", 2, 1u << 16, o.send_queue_depth);
  apply(getenv, "GRADLANE_RQ_DEPTH", 1, 1u << 16, o.recv_queue_depth);
  apply(getenv, "GRADLANE_SIGNAL_INTERVAL", 1, 1u << 15, o.signal_interval);
  apply(getenv, "GRADLANE_MAX_INLINE", 0, 1024, o.max_inline);
  apply(getenv, "GRADLANE_MAX_MESSAGE", 64, 1u << 20, o.max_message_bytes);
  if (auto key = getenv("GRADLANE_JOB_KEY")) o.job_key = *key;
  o.validate();
  return o;
}

void TransportOptions::validate() const {
  auto fail = [](const std::string& what) { throw Error(Errc::invalid_argument, "transport options: " + what); };
  if (ack_timeout < 1 || ack_timeout > 31) fail(fmt::format("ack_timeout {} outside [1, 31]", ack_timeout));
  if (retry_count > 7) fail(fmt::format("retry_count {} outside [0, 7]", retry_count));
  if (rnr_retry > 7) fail(fmt::format("rnr_retry {} outside [0, 7]", rnr_retry));
  if (connect_timeout.count() <= 0) fail("connect_timeout must be positive");
  if (send_queue_depth < 2) fail("send_queue_depth must be at least 2");
  if (recv_queue_depth < 1) fail("recv_queue_depth must be at least 1");
  if (signal_interval < 1 || signal_interval > send_queue_depth / 2) {
    fail(fmt::format("signal_interval {} must be in [1, send_queue_depth/2 = {}] so a full send queue "
                     "always has a signalled request in flight",
                     signal_interval, send_queue_depth / 2));
  }
  if (max_message_bytes < 64) fail("max_message_bytes must be at least 64");
  if (job_key.size() > kMaxJobKeyBytes) {
    fail(fmt::format("job_key (GRADLANE_JOB_KEY) has {} bytes; at most {} fit in the connect handshake", job_key.size(),
                     kMaxJobKeyBytes));
  }
}

}  // namespace gradlane
