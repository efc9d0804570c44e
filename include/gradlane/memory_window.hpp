// gradlane — memory windows: a peer may write only the slice it was granted.
//
// A region's own rkey opens the whole region to whoever holds it (or guesses it). A type-2
// memory window is a second key over a slice of a region, bound by a work request on one
// connection's queue pair: the NIC refuses an access through it that comes from any other QP,
// or arrives after the window was invalidated or bound anew (each bind draws a fresh key), or
// falls outside the region under it — and, where DeviceInfo::window_bounds_checked, outside
// the window's slice. rdma_rxe checks only the region's bounds (measured, Linux 6.1), so the
// portable way to confine a peer to one slot is one region per slot and a window over all of
// it; bind_window refuses a partial window on such a device. The owner registers the slots
// with Access::windows and without remote rights, so their own rkeys open nothing, and hands
// each peer only windows.
//
//   std::vector<MemoryRegion> slots;  // slot i = buffer[i*kSlot, (i+1)*kSlot)
//   for (...) slots.push_back(MemoryRegion::register_slice(device, buffer, i * kSlot, kSlot,
//                                                          Access::local_write | Access::windows));
//   MemoryWindow grant = MemoryWindow::allocate(device);
//   conn.bind_window(grant, slots[i], 0, kSlot, Access::remote_write);  // on the peer's QP
//   conn.advertise(id, grant.descriptor());                             // after the bind (RC order)
//   ...
//   conn.bind_window(grant, slots[j], 0, kSlot, Access::remote_write);  // the old key dies
//
// An access the NIC refuses fails the *writer's* connection (IBV_WC_REM_ACCESS_ERR); the
// owner's side of that connection also goes to the error state, its other connections are
// unaffected.
#pragma once

#include <cstdint>
#include <memory>

#include "gradlane/device.hpp"
#include "gradlane/memory.hpp"

struct ibv_mr;

namespace gradlane {

class Connection;
namespace detail {
struct WindowHandle;
}  // namespace detail

// A type-2 memory window (RAII over ibv_mw). Bound and invalidated through the Connection
// whose peer may use it (Connection::bind_window / invalidate_window). While bound it keeps
// the region's registration and pages alive. Closing the connection it is bound on revokes it
// (the key dies with the connection; the device would otherwise hold the QP — rxe hangs the
// close for ~50 s); a later bind_window gives it a fresh window.
class MemoryWindow {
 public:
  // Allocates an unbound type-2 window in the device's protection domain. Throws
  // Error(unsupported) when the device has no type-2 windows, saying what is enforced instead,
  // Error(system) when ibv_alloc_mw fails.
  static MemoryWindow allocate(const Device& device);

  MemoryWindow(MemoryWindow&&) noexcept;
  MemoryWindow& operator=(MemoryWindow&&) noexcept;
  MemoryWindow(const MemoryWindow&) = delete;
  MemoryWindow& operator=(const MemoryWindow&) = delete;
  ~MemoryWindow();  // deallocates the window (its key dies); never throws

  bool bound() const;
  // The current key: after a bind, the key the peer uses; after invalidation, a dead key.
  std::uint32_t rkey() const;
  // What the peer needs to address the bound slice (addr, length, rkey): offsets in a write are
  // relative to the slice's start. Throws Error(invalid_argument) when not bound.
  RegionDescriptor descriptor() const;

 private:
  friend class Connection;  // binds and invalidates it on its queue pair
  MemoryWindow(Device device, std::shared_ptr<detail::WindowHandle> handle);
  // Declaration order is teardown order reversed: the window goes first, then the MRs it was
  // bound over and their pages, then the device.
  Device device_;
  std::shared_ptr<ibv_mr> previous_region_;  // the MR of the bind before, until the next bind
  std::shared_ptr<void> previous_pages_;
  std::shared_ptr<ibv_mr> region_;                // the MR bound over (shared with its MemoryRegion)
  std::shared_ptr<void> pages_;                   // that region's Buffer pages
  std::shared_ptr<detail::WindowHandle> handle_;  // shared (weakly) with the connection it is bound on
};

}  // namespace gradlane
