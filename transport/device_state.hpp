// Internal: the opened device shared by a Device, its MemoryRegions and its Connections.
#pragma once

#include <infiniband/verbs.h>

#include <memory>

#include "gradlane/device.hpp"

namespace gradlane::detail {

struct DeallocPd { void operator()(ibv_pd* pd) const noexcept; };

struct DeviceState {
  // Owned by librdmacm (rdma_get_devices keeps every device open for the process lifetime),
  // so rdma_cm ids resolved to this device share the context and can use our PD.
  ibv_context* context = nullptr;
  std::unique_ptr<ibv_pd, DeallocPd> pd;
  DeviceInfo info;
  int max_rd_atomic = 1;       // outstanding RDMA READs a QP may issue / serve
};

}  // namespace gradlane::detail
