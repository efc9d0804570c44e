// What the fuzz targets share: a front-to-back reader of the fuzz input and the invariant check.
//
// Why not libFuzzer's FuzzedDataProvider: it takes integers from the *end* of the input and
// bytes from the front, which makes a seed hard to write by hand or by a generator. Here an
// input is read as one little-endian stream, so make_seeds.cpp writes seeds in exactly the
// order a target reads them; past the end every read is zero, so any input is a valid one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>

#include "gradlane/error.hpp"

namespace gradlane::fuzz {

// A violated invariant must end the run as a crash, so libFuzzer keeps the input that made it
// (a target that only returns would let a wrong decode pass silently). The builtins, not
// std::source_location: clang 14 cannot compile libstdc++ 12's <source_location>.
inline void require(bool holds, const char* what, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (holds) return;
  std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s\n", file, line, what);
  std::abort();
}

// Runs a decoder on untrusted bytes: its result, or nullopt when it refused them, which it must
// do with gradlane::Error(protocol) and nothing else (any other exception escapes: a crash).
template <class Decode>
auto decoded(Decode&& decode) -> std::optional<decltype(decode())> {
  try {
    return decode();
  } catch (const Error& e) {
    require(e.code() == Errc::protocol, "malformed input raised an error other than protocol");
    return std::nullopt;
  }
}

inline std::span<const std::byte> as_bytes(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

class Input {
 public:
  explicit Input(std::span<const std::byte> bytes) : bytes_(bytes) {}

  bool empty() const noexcept { return at_ >= bytes_.size(); }

  // The next sizeof(T) bytes, little-endian; bytes past the end read as zero.
  template <class T>
  T take() noexcept {
    static_assert(std::is_integral_v<T>);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::uint64_t{byte()} << (8 * i);
    return static_cast<T>(v);
  }

  // Up to n bytes (fewer at the end of the input).
  std::span<const std::byte> bytes(std::size_t n) noexcept {
    const std::size_t k = std::min(n, bytes_.size() - std::min(at_, bytes_.size()));
    const auto out = bytes_.subspan(std::min(at_, bytes_.size()), k);
    at_ += n;
    return out;
  }

  // Reads the rest of the input as actions: a u8 each (taken modulo `count`), then whatever
  // operands `act` reads for that action.
  template <class Act>
  void for_each_action(unsigned count, Act&& act) {
    while (!empty()) act(take<std::uint8_t>() % count);
  }

  // A plain-data record filled from the next sizeof(T) bytes, zero-padded at the end.
  template <class T>
  T record() noexcept {
    static_assert(std::is_trivially_copyable_v<T>);
    T out;
    std::memset(&out, 0, sizeof out);
    // An empty span's data() may be null, which memcpy must not be given even for 0 bytes.
    if (const auto b = bytes(sizeof(T)); !b.empty()) std::memcpy(&out, b.data(), b.size());
    return out;
  }

 private:
  std::uint8_t byte() noexcept {
    const std::uint8_t b = at_ < bytes_.size() ? std::to_integer<std::uint8_t>(bytes_[at_]) : 0;
    ++at_;
    return b;
  }

  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

}  // namespace gradlane::fuzz
