#include "loopback.hpp"

#include <chrono>
#include <cstdlib>
#include <future>

namespace gradlane::micro {

Loopback Loopback::open(const Device& device, const TransportOptions& options) {
  using namespace std::chrono_literals;
  Listener listener(device, 0, options);
  auto accepted = std::async(std::launch::async, [&] { return listener.accept(30s); });
  Connection a = connect(device, listener.address(), listener.port(), options);
  Connection b = accepted.get();
  return Loopback{device, std::move(a), std::move(b)};
}

std::optional<Device> benchmark_device(std::string& why_not) {
  DeviceSelector selector;
  if (const char* name = std::getenv("GRADLANE_DEVICE")) selector.name = name;
  if (const char* gid = std::getenv("GRADLANE_GID_INDEX")) selector.gid_index = std::atoi(gid);
  try {
    return Device::open(selector);
  } catch (const Error& e) {
    why_not = e.what();
    return std::nullopt;
  }
}

}  // namespace gradlane::micro
