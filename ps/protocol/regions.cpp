#include "ps/protocol/regions.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

namespace gradlane::ps {

ShardRegion::ShardRegion(const Device& device, std::size_t floats)
    : buffer_(Buffer::allocate(kHeaderBytes + floats * sizeof(float))),
      header_(std::construct_at(reinterpret_cast<ShardHeader*>(buffer_.data()))),
      count_(floats),
      region_(MemoryRegion::register_buffer(device, buffer_, Access::remote_read)) {}

MemoryRegion ShardRegion::register_floats_for_reads(const Device& device) const {
  return MemoryRegion::register_slice(device, buffer_, kHeaderBytes, count_ * sizeof(float), Access::local_write);
}

ModelSnapshot::ModelSnapshot(const Device& device, std::span<const float> model, std::span<const float> velocity)
    : buffer_(Buffer::allocate(model.size_bytes() + velocity.size_bytes())), region_([&] {
        // A copy on the control path, once per joining replica: the shard goes on changing.
        std::memcpy(buffer_.data(), model.data(), model.size_bytes());
        if (!velocity.empty()) std::memcpy(buffer_.data() + model.size_bytes(), velocity.data(), velocity.size_bytes());
        return MemoryRegion::register_buffer(device, buffer_, Access::remote_read);
      }()) {}

SlotRing::SlotRing(const Device& device, std::size_t floats, std::uint32_t slots, bool windowed,
                   std::uint32_t slots_per_window)
    : buffer_(Buffer::allocate(floats * sizeof(float) * slots)),
      floats_(floats),
      // Windowed: remote_read for the replica's READs of a slot, local_write for our own READs
      // into one (a replica re-reading a mirror that never came from its server's slot).
      region_(MemoryRegion::register_buffer(
          device, buffer_,
          windowed ? Access::remote_read | Access::local_write : Access::remote_write | Access::remote_read)) {
  if (!windowed) return;
  if (slots_per_window == 0 || slots % slots_per_window != 0) {
    throw Error(Errc::invalid_argument,
                fmt::format("SlotRing: {} slots are not windows of {}", slots, slots_per_window));
  }
  const std::size_t window_bytes = slot_bytes() * slots_per_window;
  window_regions_.reserve(slots / slots_per_window);
  for (std::uint32_t i = 0; i < slots / slots_per_window; ++i) {
    window_regions_.push_back(MemoryRegion::register_slice(device, buffer_, i * window_bytes, window_bytes,
                                                           Access::local_write | Access::windows));
  }
}

Connection connect_with_retry(const Device& device, const std::string& address, std::uint16_t port,
                              const TransportOptions& options, Millis timeout,
                              const std::optional<CompletionQueue>& shared) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    try {
      return shared ? connect(device, address, port, options, *shared) : connect(device, address, port, options);
    } catch (const Error& e) {
      // Rejected: its listener is not up yet. Unreachable: no answer in connect_timeout (a
      // loaded host, a first ARP). Anything else (a wrong address) is final at once.
      const bool worth_retrying = e.code() == Errc::connection_rejected || e.code() == Errc::unreachable;
      if (!worth_retrying || std::chrono::steady_clock::now() > deadline) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

}  // namespace gradlane::ps
