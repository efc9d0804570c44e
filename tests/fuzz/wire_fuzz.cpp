// Fuzz target: the transport's wire decoders (transport/wire.cpp, memory/region_descriptor.cpp),
// fed what a hostile peer controls. The input is used three ways:
//   - as a received SEND (data_path.cpp's path): decode_frame(), and for a region frame
//     decode_region_advert() of its payload;
//   - as rdma_cm private data of a connect request: check_handshake();
//   - as a region descriptor plus a slice (offset u64, length u64): RegionDescriptor::contains(),
//     the overflow-safe bounds check every remote slice goes through.
//
// What must hold (a violation aborts, so libFuzzer keeps the input):
//   - every decoder either accepts or throws gradlane::Error(protocol), nothing else;
//   - a frame or region advert that decodes re-encodes to exactly its bytes (one encoding per
//     message: a decoder that ignores a byte the encoder writes would accept what no gradlane
//     peer sends), and a frame's payload is the frame's own bytes after the header;
//   - an accepted advert's region does not wrap the address space;
//   - the handshake is accepted exactly when it starts with our magic and version;
//   - contains() agrees with the 128-bit sum offset + length <= region length.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fuzz_util.hpp"
#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"
#include "transport/wire.hpp"

namespace gradlane::fuzz {
namespace {

using Wide = unsigned __int128;

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

void region_advert(std::span<const std::byte> payload) {
  const auto advert = decoded([&] { return detail::decode_region_advert(payload); });
  if (!advert) return;
  const RegionDescriptor& r = advert->region;
  require(r.length == 0 || Wide{r.addr} + r.length <= Wide{1} << 64,
          "an accepted region advert wraps the address space");
  require(same(detail::encode_region_advert(advert->id, r), payload),
          "a region advert does not re-encode to its bytes");
}

void received_message(std::span<const std::byte> bytes) {
  const auto decoded_frame = decoded([&] { return detail::decode_frame(bytes); });
  if (!decoded_frame) return;
  const detail::Frame& frame = *decoded_frame;
  require(frame.payload.data() == bytes.data() + detail::kFrameHeaderSize &&
              frame.payload.size() + detail::kFrameHeaderSize == bytes.size(),
          "a frame's payload is not its bytes after the header");
  std::vector<std::byte> again(bytes.size());
  require(detail::encode_frame(frame.kind, frame.payload, again) == bytes.size() && same(again, bytes),
          "a decoded frame does not re-encode to its bytes");
  if (frame.kind == detail::FrameKind::region) region_advert(frame.payload);
}

void connect_request(std::span<const std::byte> private_data) {
  const bool accepted = decoded([&] {
                          detail::check_handshake(private_data);
                          return true;
                        }).has_value();
  // Magic (4 bytes) and version (2): what the handshake is documented to check. rdma_cm pads
  // private data, so what follows is not looked at.
  const auto ours = detail::encode_handshake("");
  const bool ok =
      private_data.size() >= detail::kHandshakeSize && same(private_data.first(6), std::span(ours).first(6));
  require(accepted == ok, "check_handshake disagrees with magic + version");
  // The key field of any bytes: compared without reading past them, never matched when short.
  if (accepted) {
    const bool keyless = detail::same_job_key(private_data, "");
    require(!keyless || private_data[6] == std::byte{0}, "a handshake that names a key matched the empty key");
  }
}

void slice_bounds(std::span<const std::byte> bytes) {
  Input in(bytes);
  RegionDescriptor r;
  r.addr = in.take<std::uint64_t>();
  r.length = in.take<std::uint64_t>();
  r.rkey = in.take<std::uint32_t>();
  const auto offset = in.take<std::uint64_t>();
  const auto length = in.take<std::uint64_t>();
  require(r.contains(offset, length) == (Wide{offset} + length <= r.length), "RegionDescriptor::contains is wrong");
}

}  // namespace
}  // namespace gradlane::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = gradlane::fuzz::as_bytes(data, size);
  gradlane::fuzz::received_message(bytes);
  gradlane::fuzz::region_advert(bytes);  // the advert decoder on its own, without a frame to get past
  gradlane::fuzz::connect_request(bytes);
  gradlane::fuzz::slice_bounds(bytes);
  return 0;
}
