// RLIMIT_MEMLOCK: the most common reason RDMA jobs fail at start-up (BytePS, NCCL and
// perftest issue trackers are full of it). Check it before registering anything and say
// exactly what to change.
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fmt/format.h>

#include "common/syscall_error.hpp"
#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"

namespace gradlane {
namespace {

std::string human_bytes(std::uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} bytes", b);
}

bool process_has_cap_ipc_lock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
  // No glibc wrapper for capget; libcap would be a dependency for one call.
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
}

}  // namespace

std::optional<std::string> memlock_problem(std::optional<std::uint64_t> limit_bytes, bool has_cap_ipc_lock,
                                           std::uint64_t bytes_to_pin) {
  if (!limit_bytes || has_cap_ipc_lock || bytes_to_pin <= *limit_bytes) return std::nullopt;
  return fmt::format(
      "RLIMIT_MEMLOCK is {} but gradlane needs to pin {} of registered memory. Raise the "
      "limit for the job: `ulimit -l unlimited` in the shell that starts it (needs a hard limit "
      "that allows it), `* - memlock unlimited` in /etc/security/limits.conf (then log in again), "
      "LimitMEMLOCK=infinity in a systemd unit, or `--ulimit memlock=-1` for docker run. "
      "Check with `ulimit -l` (KiB).",
      human_bytes(*limit_bytes), human_bytes(bytes_to_pin));
}

void check_memlock(std::uint64_t bytes_to_pin) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    detail::throw_call_failed(Errc::system, "getrlimit(RLIMIT_MEMLOCK)", errno);
  }
  const std::optional<std::uint64_t> soft =
      limit.rlim_cur == RLIM_INFINITY ? std::nullopt : std::optional<std::uint64_t>(limit.rlim_cur);
  if (auto problem = memlock_problem(soft, process_has_cap_ipc_lock(), bytes_to_pin)) {
    throw Error(Errc::memlock_too_low, *problem);
  }
}

}  // namespace gradlane
