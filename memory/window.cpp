// Memory windows: allocation and teardown. Binding is a send-queue work request, so it lives
// with the connection (transport/window_ops.cpp).
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdio>
#include <fmt/format.h>

#include "common/syscall_error.hpp"
#include "memory/window_handle.hpp"
#include "gradlane/error.hpp"
#include "gradlane/memory_window.hpp"

namespace gradlane {
namespace detail {

void DeallocWindow::operator()(ibv_mw* mw) const noexcept {
  if (int rc = ibv_dealloc_mw(mw); rc != 0) {
    std::fprintf(stderr, "gradlane: %s\n", call_failed("ibv_dealloc_mw", rc).c_str());
  }
}

WindowPtr allocate_window(const Device& device) {
  const DeviceInfo& info = device.info();
  if (!info.memory_windows) {
    throw Error(Errc::unsupported,
                fmt::format("{} has no type-2 memory windows (device_cap_flags lacks MEM_WINDOW_TYPE_2A/2B): a "
                            "peer cannot be confined to one slot by a window. What is still enforced there: the NIC "
                            "checks each access against the registered region its rkey names (bounds and access "
                            "rights) within this protection domain, so register each slot as a region of its own "
                            "(MemoryRegion::register_slice) to bound a peer to it; a slot's rkey cannot be revoked "
                            "short of deregistering it, and any QP that learns it can use it",
                            info.name));
  }
  errno = 0;
  ibv_mw* mw = ibv_alloc_mw(device.pd(), IBV_MW_TYPE_2);
  if (mw == nullptr) {
    throw_call_failed(Errc::system,
                      fmt::format("ibv_alloc_mw({}, type 2) (max_mw {})", info.name, info.max_memory_windows),
                      last_errno_or(ENOMEM));
  }
  return WindowPtr(mw);
}

}  // namespace detail

MemoryWindow MemoryWindow::allocate(const Device& device) {
  auto handle = std::make_shared<detail::WindowHandle>();
  handle->mw = detail::allocate_window(device);
  return MemoryWindow(device, std::move(handle));
}

MemoryWindow::MemoryWindow(Device device, std::shared_ptr<detail::WindowHandle> handle)
    : device_(std::move(device)), handle_(std::move(handle)) {}

MemoryWindow::MemoryWindow(MemoryWindow&&) noexcept = default;

MemoryWindow& MemoryWindow::operator=(MemoryWindow&& other) noexcept {
  // The old window goes before what it was bound over (and its device) is released.
  handle_ = std::move(other.handle_);
  pages_ = std::move(other.pages_);
  region_ = std::move(other.region_);
  previous_pages_ = std::move(other.previous_pages_);
  previous_region_ = std::move(other.previous_region_);
  device_ = std::move(other.device_);
  return *this;
}

MemoryWindow::~MemoryWindow() = default;

bool MemoryWindow::bound() const { return handle_ && handle_->bound.has_value(); }

std::uint32_t MemoryWindow::rkey() const {
  if (!handle_) throw Error(Errc::invalid_argument, "memory window was moved from");
  if (!handle_->mw) {
    throw Error(Errc::invalid_argument, "memory window was revoked when its connection closed: bind it again");
  }
  return handle_->mw->rkey;
}

RegionDescriptor MemoryWindow::descriptor() const {
  if (!bound()) throw Error(Errc::invalid_argument, "memory window is not bound: bind it through a Connection first");
  return *handle_->bound;
}

}  // namespace gradlane
