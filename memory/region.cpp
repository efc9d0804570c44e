// Memory regions: ibv_reg_mr with the minimal access flags, and their descriptors.
#include <infiniband/verbs.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <fmt/format.h>

#include "common/syscall_error.hpp"
#include "gradlane/device.hpp"
#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"

namespace gradlane {

int to_ibv_access(Access access) {
  int flags = 0;
  // Verbs rejects REMOTE_WRITE without LOCAL_WRITE (EINVAL), so remote_write implies it.
  if (has(access, Access::local_write) || has(access, Access::remote_write)) flags |= IBV_ACCESS_LOCAL_WRITE;
  if (has(access, Access::remote_write)) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (has(access, Access::remote_read)) flags |= IBV_ACCESS_REMOTE_READ;
  if (has(access, Access::windows)) flags |= IBV_ACCESS_MW_BIND;
  return flags;
}

namespace {

std::string access_text(Access access) {
  std::string s;
  if (has(access, Access::local_write)) s += "local_write|";
  if (has(access, Access::remote_write)) s += "remote_write|";
  if (has(access, Access::remote_read)) s += "remote_read|";
  if (has(access, Access::windows)) s += "windows|";
  if (s.empty()) return "local";
  s.pop_back();
  return s;
}

}  // namespace

namespace {

void deregister(ibv_mr* mr) noexcept {
  if (int rc = ibv_dereg_mr(mr); rc != 0) {
    // Only fails while a memory window is bound over the MR, which the windows' shared
    // ownership of the MR rules out; report, never throw from cleanup.
    std::fprintf(stderr, "gradlane: %s\n", detail::call_failed("ibv_dereg_mr", rc).c_str());
  }
}

}  // namespace

MemoryRegion MemoryRegion::register_memory(const Device& device, void* addr, std::size_t length, Access access) {
  if (addr == nullptr || length == 0) {
    throw Error(Errc::invalid_argument, "register_memory: empty range");
  }
  errno = 0;
  ibv_mr* mr = ibv_reg_mr(device.pd(), addr, length, to_ibv_access(access));
  if (mr == nullptr) {
    const int err = detail::last_errno_or(EINVAL);
    const std::string call =
        fmt::format("ibv_reg_mr({}, {} bytes at {}, {})", device.info().name, length, addr, access_text(access));
    if (err == ENOMEM || err == EPERM || err == EAGAIN) {
      // Pinning beyond RLIMIT_MEMLOCK fails with ENOMEM/EPERM: say what to raise.
      rlimit limit{};
      std::optional<std::uint64_t> soft;
      if (::getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) soft = limit.rlim_cur;
      if (auto problem = memlock_problem(soft, false, length)) {
        throw Error(Errc::memlock_too_low, detail::call_failed(call, err) + ". " + *problem, err);
      }
    }
    detail::throw_call_failed(Errc::registration_failed, call, err);
  }
  return MemoryRegion(device, std::shared_ptr<ibv_mr>(mr, deregister), access);
}

MemoryRegion MemoryRegion::register_buffer(const Device& device, const Buffer& buffer, Access access) {
  MemoryRegion region = register_memory(device, buffer.data(), buffer.size(), access);
  region.pages_ = buffer.pages_;
  return region;
}

MemoryRegion MemoryRegion::register_slice(const Device& device, const Buffer& buffer, std::size_t offset,
                                          std::size_t length, Access access) {
  if (offset > buffer.size() || length > buffer.size() - offset) {
    throw Error(Errc::out_of_range, fmt::format("register_slice: {} bytes at offset {} exceed the buffer ({} bytes)",
                                                length, offset, buffer.size()));
  }
  MemoryRegion region = register_memory(device, buffer.data() + offset, length, access);
  region.pages_ = buffer.pages_;
  return region;
}

MemoryRegion::~MemoryRegion() = default;

std::byte* MemoryRegion::data() const { return static_cast<std::byte*>(mr_->addr); }
std::size_t MemoryRegion::length() const { return mr_->length; }
std::uint32_t MemoryRegion::lkey() const { return mr_->lkey; }
std::uint32_t MemoryRegion::rkey() const { return mr_->rkey; }

}  // namespace gradlane
