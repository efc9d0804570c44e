#include "gradlane/options.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "gradlane/error.hpp"
#include "common/unique_fd.hpp"
#include "common/env.hpp"

namespace gradlane {
namespace {

template <class T>
void apply(const detail::Getenv& getenv, const char* name, std::uint64_t min, std::uint64_t max, T& field) {
  if (auto value = detail::env_integer(getenv, name, min, max)) field = static_cast<T>(*value);
}

}  // namespace

TransportOptions TransportOptions::from_env(const std::function<std::optional<std::string>(const char*)>& getenv_fn) {
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
  apply(getenv, "GRADLANE_MAX_PENDING_ACCEPTS", 1, 1u << 16, o.max_pending_accepts);
  apply(getenv, "GRADLANE_TOS", 0, 255, o.type_of_service);
  const auto key = getenv("GRADLANE_JOB_KEY");
  const auto key_file = getenv("GRADLANE_JOB_KEY_FILE");
  if (key && key_file) {
    throw Error(Errc::invalid_argument, "both GRADLANE_JOB_KEY and GRADLANE_JOB_KEY_FILE are set: keep one");
  }
  if (key) o.job_key = *key;
  if (key_file) o.job_key = read_key_file(*key_file);
  if (auto insecure = detail::env_integer(getenv, "GRADLANE_INSECURE", 0, 1)) o.insecure = *insecure == 1;
  o.validate();
  if (o.job_key.empty() && !o.insecure) {
    throw Error(Errc::invalid_argument,
                "no job key: set GRADLANE_JOB_KEY_FILE to a file (mode 0600) holding the job's shared secret, or "
                "GRADLANE_JOB_KEY; every process of the job and every gradlaned it uses needs the same key. "
                "GRADLANE_INSECURE=1 runs without one: any process that reaches the port can then connect");
  }
  if (o.job_key.empty()) {
    // fputs, not fmt::print: a closed stderr must not turn a warning into an exception.
    std::fputs(
        "gradlane: warning: running without a job key (GRADLANE_INSECURE=1): any process that "
        "reaches this host's RDMA ports can connect\n",
        stderr);
  }
  return o;
}

std::string TransportOptions::read_key_file(const std::string& path) {
  auto fail = [&](const std::string& what) {
    throw Error(Errc::invalid_argument, fmt::format("job key file {}: {}", path, what));
  };
  // O_NOFOLLOW: the file named is the file checked, not where a link someone planted points.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) fail(std::strerror(errno));
  const sidecar::UniqueFd file(fd);
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  if ((st.st_mode & 077) != 0) {
    fail(fmt::format("mode {:04o} lets others read the key; chmod 600 it", st.st_mode & 07777));
  }
  std::array<char, kMaxJobKeyBytes + 2> buffer{};
  const ssize_t n = ::read(file.get(), buffer.data(), buffer.size());
  if (n < 0) fail(std::strerror(errno));
  std::string key(buffer.data(), static_cast<std::size_t>(n));
  if (const auto newline = key.find('\n'); newline != std::string::npos) key.resize(newline);
  if (key.empty()) fail("empty: write the job's key on its first line");
  if (key.size() > kMaxJobKeyBytes) fail(fmt::format("the key is longer than {} bytes", kMaxJobKeyBytes));
  return key;
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
    fail(
        fmt::format("signal_interval {} must be in [1, send_queue_depth/2 = {}] so a full send queue "
                    "always has a signalled request in flight",
                    signal_interval, send_queue_depth / 2));
  }
  if (max_message_bytes < 64) fail("max_message_bytes must be at least 64");
  if (max_pending_accepts < 1) fail("max_pending_accepts must be at least 1");
  if (job_key.size() > kMaxJobKeyBytes) {
    fail(fmt::format("job_key (GRADLANE_JOB_KEY) has {} bytes; at most {} fit in the connect handshake", job_key.size(),
                     kMaxJobKeyBytes));
  }
}

}  // namespace gradlane
