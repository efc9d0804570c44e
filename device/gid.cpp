#include "device/gid.hpp"

#include <fmt/format.h>

namespace gradlane::detail {

std::optional<std::string> gid_ipv4(const std::array<std::uint8_t, 16>& raw) {
  for (int i = 0; i < 10; ++i) {
    if (raw[i] != 0) return std::nullopt;
  }
  if (raw[10] != 0xff || raw[11] != 0xff) return std::nullopt;
  return fmt::format("{}.{}.{}.{}", raw[12], raw[13], raw[14], raw[15]);
}

std::string gid_text(const std::array<std::uint8_t, 16>& raw) {
  std::string s;
  for (int i = 0; i < 16; i += 2) {
    if (i) s += ':';
    s += fmt::format("{:02x}{:02x}", raw[i], raw[i + 1]);
  }
  return s;
}

const char* gid_type_name(GidType type) {
  switch (type) {
    case GidType::ib:
      return "IB";
    case GidType::roce_v1:
      return "RoCE v1";
    case GidType::roce_v2:
      return "RoCE v2";
  }
  return "?";
}

std::optional<int> choose_gid_index(const std::vector<GidEntry>& table, bool ethernet) {
  if (!ethernet) {
    for (const auto& e : table) {
      if (e.index == 0) return 0;
    }
    return std::nullopt;
  }
  for (const auto& e : table) {
    if (e.type == GidType::roce_v2 && gid_ipv4(e.raw)) return e.index;
  }
  for (const auto& e : table) {
    if (e.type == GidType::roce_v2) return e.index;
  }
  return std::nullopt;
}

}  // namespace gradlane::detail
