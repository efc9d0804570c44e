// Binding and invalidating memory windows: send-queue work requests on a connection's QP.
//
// Type-2 windows are bound by a BIND_MW work request, and the QP that posts it is the only one
// the window then admits. Each bind draws the next key (ibv_inc_rkey: the low 8 bits, which
// the provider lets the caller choose), so the key a peer held before dies with the rebind.
// Providers check the key named in the request against the window's current one, so the
// window's rkey is updated at post time — the caller owns that bookkeeping for type 2.
#include <infiniband/verbs.h>

#include <fmt/format.h>

#include "gradlane/connection.hpp"
#include "gradlane/memory_window.hpp"
#include "transport/connection_state.hpp"

namespace gradlane {
namespace {

int window_access_flags(Access access) {
  int flags = 0;
  if (has(access, Access::remote_write)) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (has(access, Access::remote_read)) flags |= IBV_ACCESS_REMOTE_READ;
  return flags;
}

// Everything the device would refuse with a bind error — which fails the whole connection —
// is refused here first, with nothing posted.
void check_bind(const detail::ConnectionState& s, const Device& region_device, Access region_access, std::size_t offset,
                std::size_t length, std::size_t region_length, Access access) {
  const auto refuse = [&](const std::string& why) {
    throw Error(Errc::invalid_argument, fmt::format("bind_window on {}: {}; nothing was posted", s.description, why));
  };
  if (access == Access::local ||
      (static_cast<unsigned>(access) & ~static_cast<unsigned>(Access::remote_write | Access::remote_read)) != 0) {
    refuse("a window grants remote_write and/or remote_read, nothing else");
  }
  if (!has(region_access, Access::windows)) refuse("the region was not registered with Access::windows");
  if (has(access, Access::remote_write) && !has(region_access, Access::local_write) &&
      !has(region_access, Access::remote_write)) {
    refuse("a writable window needs a region registered with local_write (IB C10-74)");
  }
  if (region_device.pd() != s.device.pd())
    refuse("the region belongs to another protection domain than this connection");
  if (length == 0) refuse("a window of 0 bytes");
  if (offset > region_length || length > region_length - offset) {
    throw Error(Errc::out_of_range,
                fmt::format("bind_window on {}: {} bytes at offset {} exceed the region ({} bytes); nothing was posted",
                            s.description, length, offset, region_length));
  }
  const DeviceInfo& info = s.device.info();
  if (!info.window_bounds_checked && (offset != 0 || length != region_length)) {
    // A window over part of a region would promise a confinement the device does not give.
    throw Error(Errc::unsupported,
                fmt::format("bind_window on {}: {} does not confine an access through a window to the window's range "
                            "(rdma_rxe checks the range of the region under it), so a window over {} of the "
                            "region's {} bytes would still let the peer write all of the region: register the slot "
                            "as a region of its own (MemoryRegion::register_slice) and bind the window over all of "
                            "it; nothing was posted",
                            s.description, info.name, length, region_length));
  }
}

ibv_send_wr local_invalidate(std::uint32_t rkey) {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.invalidate_rkey = rkey;
  return wr;
}

}  // namespace

void detail::ConnectionState::revoke_windows() noexcept {
  for (const auto& weak : bound_windows) {
    if (auto handle = weak.lock(); handle && handle->bound_on == this) {
      handle->mw.reset();  // ibv_dealloc_mw: the device lets go of this QP, the key dies
      handle->bound.reset();
      handle->bound_on = nullptr;
    }
  }
  bound_windows.clear();
}

OpId Connection::bind_window(MemoryWindow& window, const MemoryRegion& region, std::size_t offset, std::size_t length,
                             Access access) {
  auto& s = *state_;
  if (!window.handle_) throw Error(Errc::invalid_argument, "bind_window: the memory window was moved from");
  check_bind(s, region.device_, region.access(), offset, length, region.length(), access);
  detail::WindowHandle& handle = *window.handle_;
  if (!handle.mw) handle.mw = detail::allocate_window(window.device_);  // revoked with its connection
  ibv_mw* mw = handle.mw.get();
  const std::uint32_t old_rkey = mw->rkey;
  const std::uint32_t new_rkey = ibv_inc_rkey(old_rkey);
  ibv_send_wr bind{};
  bind.opcode = IBV_WR_BIND_MW;
  bind.bind_mw.mw = mw;
  bind.bind_mw.rkey = new_rkey;
  bind.bind_mw.bind_info.mr = region.mr_.get();
  bind.bind_mw.bind_info.addr = reinterpret_cast<std::uintptr_t>(region.data()) + offset;
  bind.bind_mw.bind_info.length = length;
  bind.bind_mw.bind_info.mw_access_flags = window_access_flags(access);
  const detail::OpRecord bind_record{IBV_WR_BIND_MW, length, bind.bind_mw.bind_info.addr, new_rkey};
  OpId op = 0;
  if (handle.bound) {
    // A bound type-2 window must be made free before it binds again (o10-37.2.30).
    ibv_send_wr invalidate = local_invalidate(old_rkey);
    op = s.post_pair(invalidate, {IBV_WR_LOCAL_INV, 0, 0, old_rkey}, bind, bind_record);
  } else {
    op = s.post(bind, bind_record, true);
  }
  mw->rkey = new_rkey;
  // The MR bound before stays pinned until the next bind: the device releases it only when
  // this post's LOCAL_INV executes, and verbs refuses to deregister it before.
  window.previous_region_ = std::move(window.region_);
  window.previous_pages_ = std::move(window.pages_);
  window.region_ = region.mr_;
  window.pages_ = region.pages_;
  handle.bound = RegionDescriptor{bind.bind_mw.bind_info.addr, length, new_rkey};
  if (handle.bound_on != &s) {
    std::erase_if(s.bound_windows, [](const auto& weak) { return weak.expired(); });
    s.bound_windows.push_back(window.handle_);
    handle.bound_on = &s;
  }
  return op;
}

OpId Connection::invalidate_window(MemoryWindow& window) {
  auto& s = *state_;
  if (!window.bound()) {
    throw Error(Errc::invalid_argument, fmt::format("invalidate_window on {}: the window is not bound", s.description));
  }
  const std::uint32_t rkey = window.rkey();
  ibv_send_wr wr = local_invalidate(rkey);
  const OpId op = s.post(wr, {IBV_WR_LOCAL_INV, 0, 0, rkey}, true);
  // The region stays pinned until the window goes or binds again: the device releases it
  // only when the invalidation executes.
  window.handle_->bound.reset();
  return op;
}

}  // namespace gradlane
