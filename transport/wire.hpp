// Internal: the framing of SEND/RECV control messages and of the connect handshake.
//
// Every control message starts with a 12-byte header (magic u32, kind u16, reserved u16 = 0,
// payload length u32; little-endian). A peer is
// untrusted input: decode_frame() checks everything and throws Error(protocol) naming what is
// wrong, so a malformed or hostile message fails only its own connection.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"

namespace gradlane::detail {

inline constexpr std::uint32_t kFrameMagic = 0x31434c47;      // "GLC1" little-endian
inline constexpr std::uint32_t kHandshakeMagic = 0x314e4c47;  // "GLN1"
inline constexpr std::uint16_t kProtocolVersion = 1;
inline constexpr std::size_t kFrameHeaderSize = 12;
inline constexpr std::size_t kHandshakeSize = 8;

enum class FrameKind : std::uint16_t {
  message = 1,  // application control message
  region = 2,   // region advertisement: u32 region id + RegionDescriptor
};

struct Frame {
  FrameKind kind = FrameKind::message;
  std::span<const std::byte> payload;  // view into the decoded buffer
};

// Writes header + payload into `out` (which must hold kFrameHeaderSize + payload.size()).
std::size_t encode_frame(FrameKind kind, std::span<const std::byte> payload, std::span<std::byte> out);
Frame decode_frame(std::span<const std::byte> bytes);

std::array<std::byte, 4 + RegionDescriptor::kWireSize> encode_region_advert(std::uint32_t id,
                                                                           const RegionDescriptor& region);
struct RegionAdvert {
  std::uint32_t id = 0;
  RegionDescriptor region;
};
RegionAdvert decode_region_advert(std::span<const std::byte> payload);

// rdma_cm private data of a connect request: magic + protocol version.
std::array<std::byte, kHandshakeSize> encode_handshake();
// Throws Error(protocol) when the private data is not a gradlane handshake of our version.
void check_handshake(std::span<const std::byte> private_data);

}  // namespace gradlane::detail
