// A connected pair of gradlane connections inside one process (both ends on one device),
// for benchmarks that need a peer: rdma_cm setup needs the accept on another thread, the
// data path then runs from one thread on both ends.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gradlane/gradlane.hpp"

namespace gradlane::micro {

struct Loopback {
  Device device;
  Connection a;  // the connecting side
  Connection b;  // the accepting side

  static Loopback open(const Device& device, const TransportOptions& options = {});
};

// The benchmark device: GRADLANE_DEVICE / GRADLANE_GID_INDEX (as ci/softroce.sh sets them),
// else the only device; nullopt with the reason when there is none.
std::optional<Device> benchmark_device(std::string& why_not);

// How the benchmarks reach the shared device and its loopback pair (owned by main).
struct DeviceContext {
  Device& device;
  Loopback& pair;
};

void register_registration_benchmarks(DeviceContext* device);  // nullptr: native ones only
void register_descriptor_benchmarks(DeviceContext* device);
void register_data_path_benchmarks(DeviceContext& device);
void register_clock_benchmarks(DeviceContext* device);

}  // namespace gradlane::micro
