// Internal: the verbs memory window behind a MemoryWindow, shared by the memory layer (which
// allocates it) and the transport (which binds it on a QP).
//
// Why shared: a type-2 window bound on a QP holds a reference on that QP in the device, and
// rdma_rxe's destroy_qp waits for it — measured on Linux 6.1: closing a connection with a
// window still bound hung 52 s. So the connection keeps a weak reference to every window bound
// on it and, before it destroys its QP, deallocates those still bound there (revoking their
// keys, which die with the connection anyway). The MemoryWindow sees the revocation here and
// allocates a fresh window at its next bind.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <optional>

#include "gradlane/device.hpp"
#include "gradlane/memory.hpp"

namespace gradlane::detail {

struct DeallocWindow {
  void operator()(ibv_mw* mw) const noexcept;  // memory/window.cpp
};
using WindowPtr = std::unique_ptr<ibv_mw, DeallocWindow>;

// ibv_alloc_mw(type 2) in the device's PD; Error(unsupported) when the device has no type-2
// windows (saying what is enforced instead), Error(system) when the call fails.
WindowPtr allocate_window(const Device& device);

struct WindowHandle {
  WindowPtr mw;                           // null once revoked (or moved from)
  std::optional<RegionDescriptor> bound;  // the slice and key a peer may use, while bound
  const void* bound_on = nullptr;         // identity of the connection state it is bound on
};

}  // namespace gradlane::detail
