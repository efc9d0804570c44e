// Internal: choosing the GID a RoCE connection uses.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gradlane::detail {

enum class GidType { ib, roce_v1, roce_v2 };

struct GidEntry {
  int index = 0;
  GidType type = GidType::ib;
  std::array<std::uint8_t, 16> raw{};
};

// IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), nullopt otherwise.
std::optional<std::string> gid_ipv4(const std::array<std::uint8_t, 16>& raw);
std::string gid_text(const std::array<std::uint8_t, 16>& raw);
const char* gid_type_name(GidType type);

// The GID index to use when the user did not choose one: on Ethernet ports the first RoCE v2
// GID with an IPv4 address (what rdma_cm will pick for an IPv4 connection, and what perftest
// users pass as -x), then the first RoCE v2 GID; on InfiniBand index 0. nullopt if none fits.
std::optional<int> choose_gid_index(const std::vector<GidEntry>& table, bool ethernet);

}  // namespace gradlane::detail
