#include "gradlane/registration_cache.hpp"

#include "gradlane/device.hpp"

namespace gradlane {

RegistrationCache::RegistrationCache(const Device& device, std::size_t capacity)
    : BasicRegistrationCache<MemoryRegion>(
          [device](void* addr, std::size_t length, Access access) {
            return MemoryRegion::register_memory(device, addr, length, access);
          },
          capacity) {}

}  // namespace gradlane
