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

#include <optional>
#include <string_view>

#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"
#include "gradlane/options.hpp"

namespace gradlane::detail {

inline constexpr std::uint32_t kFrameMagic = 0x31434c47;      // "GLC1" little-endian
inline constexpr std::uint32_t kHandshakeMagic = 0x314e4c47;  // "GLN1"
inline constexpr std::uint16_t kProtocolVersion = 2;          // 2: the job key in the handshake
inline constexpr std::size_t kFrameHeaderSize = 12;
// magic u32, version u16, key length u16, key (kMaxJobKeyBytes, zero-padded): 40 of the 56
// bytes of private data a RoCE/IB connect request carries.
inline constexpr std::size_t kHandshakeSize = 8 + kMaxJobKeyBytes;
inline constexpr std::uint32_t kRefusalMagic = 0x31464c47;  // "GLF1": a listener's reasoned reject

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

// rdma_cm private data of a connect request and of its answer: magic, protocol version and
// the sender's job key. `job_key` holds at most kMaxJobKeyBytes (validated options).
std::array<std::byte, kHandshakeSize> encode_handshake(std::string_view job_key);
// Throws Error(protocol) when the private data is not a gradlane handshake of our version.
void check_handshake(std::span<const std::byte> private_data);
// Whether a checked handshake carries exactly `job_key` (compared in constant time).
bool same_job_key(std::span<const std::byte> private_data, std::string_view job_key);

// Why a listener refused a connect request, in the reject's private data, so the connector
// can say so instead of a bare "rejected".
enum class Refusal : std::uint16_t {
  job_key = 1,  // the request's job key differs from the listener's
  busy = 2,     // the listener has max_pending_accepts handshakes in progress already
};
std::array<std::byte, 8> encode_refusal(Refusal why);
std::optional<Refusal> decode_refusal(std::span<const std::byte> private_data);

// A one-sided operation of `length` bytes as work requests the port carries: spans of at most
// `largest_message` bytes (max_msg_sz, itself at most 2^31), in order, covering it exactly. A
// length of 0 is one empty span (a doorbell).
struct MessageSpan {
  std::uint64_t offset = 0;
  std::uint32_t length = 0;
};
std::vector<MessageSpan> split_into_messages(std::uint64_t length, std::uint64_t largest_message);

}  // namespace gradlane::detail
