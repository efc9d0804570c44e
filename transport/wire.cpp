#include "transport/wire.hpp"

#include <algorithm>
#include <cstring>
#include <fmt/format.h>

#include "gradlane/error.hpp"

namespace gradlane::detail {
namespace {

void put_u32(std::byte* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
void put_u16(std::byte* out, std::uint16_t v) {
  out[0] = static_cast<std::byte>(v & 0xff);
  out[1] = static_cast<std::byte>(v >> 8);
}
std::uint32_t get_u32(const std::byte* in) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(in[i]) << (8 * i);
  return v;
}
std::uint16_t get_u16(const std::byte* in) {
  return static_cast<std::uint16_t>(static_cast<unsigned>(in[0]) | (static_cast<unsigned>(in[1]) << 8));
}

}  // namespace

std::size_t encode_frame(FrameKind kind, std::span<const std::byte> payload, std::span<std::byte> out) {
  const std::size_t total = kFrameHeaderSize + payload.size();
  if (out.size() < total) {
    throw Error(Errc::invalid_argument,
                fmt::format("control message of {} bytes exceeds the {}-byte message limit (max_message_bytes "
                            "includes a {}-byte header)",
                            payload.size(), out.size(), kFrameHeaderSize));
  }
  put_u32(out.data(), kFrameMagic);
  put_u16(out.data() + 4, static_cast<std::uint16_t>(kind));
  put_u16(out.data() + 6, 0);
  put_u32(out.data() + 8, static_cast<std::uint32_t>(payload.size()));
  if (!payload.empty()) std::memcpy(out.data() + kFrameHeaderSize, payload.data(), payload.size());
  return total;
}

Frame decode_frame(std::span<const std::byte> bytes) {
  if (bytes.size() < kFrameHeaderSize) {
    throw Error(Errc::protocol, fmt::format("control message of {} bytes is shorter than the {}-byte header",
                                            bytes.size(), kFrameHeaderSize));
  }
  if (const auto magic = get_u32(bytes.data()); magic != kFrameMagic) {
    throw Error(Errc::protocol,
                fmt::format("control message has magic {:#010x}, expected {:#010x}: the peer is not speaking "
                            "gradlane's control protocol",
                            magic, kFrameMagic));
  }
  const auto kind = get_u16(bytes.data() + 4);
  // Reserved: every gradlane peer writes 0. Accepting other values would take frames no peer of
  // this version sends (and silently ignore whatever a future version puts there).
  if (const auto reserved = get_u16(bytes.data() + 6); reserved != 0) {
    throw Error(Errc::protocol, fmt::format("control message header has reserved bytes {:#06x}, expected 0", reserved));
  }
  const auto length = get_u32(bytes.data() + 8);
  if (length != bytes.size() - kFrameHeaderSize) {
    throw Error(Errc::protocol, fmt::format("control message header says {} payload bytes but {} arrived", length,
                                            bytes.size() - kFrameHeaderSize));
  }
  if (kind != static_cast<std::uint16_t>(FrameKind::message) && kind != static_cast<std::uint16_t>(FrameKind::region)) {
    throw Error(Errc::protocol, fmt::format("control message of unknown kind {}", kind));
  }
  return {static_cast<FrameKind>(kind), bytes.subspan(kFrameHeaderSize)};
}

std::array<std::byte, 4 + RegionDescriptor::kWireSize> encode_region_advert(std::uint32_t id,
                                                                            const RegionDescriptor& region) {
  std::array<std::byte, 4 + RegionDescriptor::kWireSize> out{};
  put_u32(out.data(), id);
  region.encode(std::span<std::byte, RegionDescriptor::kWireSize>(out.data() + 4, RegionDescriptor::kWireSize));
  return out;
}

RegionAdvert decode_region_advert(std::span<const std::byte> payload) {
  if (payload.size() != 4 + RegionDescriptor::kWireSize) {
    throw Error(Errc::protocol, fmt::format("region advertisement of {} bytes, expected {}", payload.size(),
                                            4 + RegionDescriptor::kWireSize));
  }
  RegionAdvert advert;
  advert.id = get_u32(payload.data());
  advert.region = RegionDescriptor::decode(
      std::span<const std::byte, RegionDescriptor::kWireSize>(payload.data() + 4, RegionDescriptor::kWireSize));
  if (advert.region.length > 0 && advert.region.addr + advert.region.length < advert.region.addr) {
    throw Error(Errc::protocol, fmt::format("region advertisement {} wraps the address space (addr {:#x}, length {})",
                                            advert.id, advert.region.addr, advert.region.length));
  }
  return advert;
}

std::array<std::byte, kHandshakeSize> encode_handshake(std::string_view job_key) {
  std::array<std::byte, kHandshakeSize> out{};
  put_u32(out.data(), kHandshakeMagic);
  put_u16(out.data() + 4, kProtocolVersion);
  const std::size_t n = std::min(job_key.size(), kMaxJobKeyBytes);
  put_u16(out.data() + 6, static_cast<std::uint16_t>(n));
  std::memcpy(out.data() + 8, job_key.data(), n);
  return out;
}

bool same_job_key(std::span<const std::byte> private_data, std::string_view job_key) {
  if (private_data.size() < kHandshakeSize) return false;
  const std::size_t length = get_u16(private_data.data() + 6);
  // Every byte of the field is looked at whatever the keys hold: the time taken tells a
  // guesser nothing about how much of a key was right.
  std::array<std::byte, kMaxJobKeyBytes> mine{};
  std::memcpy(mine.data(), job_key.data(), std::min(job_key.size(), kMaxJobKeyBytes));
  unsigned differ = length != job_key.size() ? 1U : 0U;
  for (std::size_t i = 0; i < kMaxJobKeyBytes; ++i) {
    differ |= static_cast<unsigned>(mine[i] ^ private_data[8 + i]);
  }
  return differ == 0;
}

std::array<std::byte, 8> encode_refusal(Refusal why) {
  std::array<std::byte, 8> out{};
  put_u32(out.data(), kRefusalMagic);
  put_u16(out.data() + 4, static_cast<std::uint16_t>(why));
  return out;
}

std::optional<Refusal> decode_refusal(std::span<const std::byte> private_data) {
  if (private_data.size() < 8 || get_u32(private_data.data()) != kRefusalMagic) return std::nullopt;
  const std::uint16_t why = get_u16(private_data.data() + 4);
  if (why == static_cast<std::uint16_t>(Refusal::job_key)) return Refusal::job_key;
  if (why == static_cast<std::uint16_t>(Refusal::busy)) return Refusal::busy;
  return std::nullopt;
}

void check_handshake(std::span<const std::byte> private_data) {
  // rdma_cm pads private data (to 56 bytes on IB/RoCE), so only a minimum size is checked.
  if (private_data.size() < kHandshakeSize || get_u32(private_data.data()) != kHandshakeMagic) {
    throw Error(Errc::protocol, "connect request without a gradlane handshake (not a gradlane peer)");
  }
  if (const auto version = get_u16(private_data.data() + 4); version != kProtocolVersion) {
    throw Error(Errc::protocol,
                fmt::format("peer speaks gradlane protocol version {}, this side {}", version, kProtocolVersion));
  }
}

std::vector<MessageSpan> split_into_messages(std::uint64_t length, std::uint64_t largest_message) {
  const std::uint64_t limit =
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(largest_message, std::uint64_t{1} << 31));
  std::vector<MessageSpan> spans;
  std::uint64_t offset = 0;
  do {
    const std::uint64_t n = std::min(limit, length - offset);
    spans.push_back({offset, static_cast<std::uint32_t>(n)});
    offset += n;
  } while (offset < length);
  return spans;
}

}  // namespace gradlane::detail
