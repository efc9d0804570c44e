// RegionDescriptor's wire format. Its own file, apart from region.cpp's verbs calls, because
// it is the part a peer feeds: the fuzz build (tests/fuzz) links this codec without verbs.
#include "gradlane/memory.hpp"

namespace gradlane {
namespace {

void put_le(std::byte* out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
std::uint64_t get_le(const std::byte* in, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace

void RegionDescriptor::encode(std::span<std::byte, kWireSize> out) const {
  put_le(out.data(), addr, 8);
  put_le(out.data() + 8, length, 8);
  put_le(out.data() + 16, rkey, 4);
}

RegionDescriptor RegionDescriptor::decode(std::span<const std::byte, kWireSize> in) {
  return {get_le(in.data(), 8), get_le(in.data() + 8, 8), static_cast<std::uint32_t>(get_le(in.data() + 16, 4))};
}

}  // namespace gradlane
