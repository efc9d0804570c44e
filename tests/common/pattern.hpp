// Test data: a deterministic byte pattern per (seed, offset), so the receiver can verify every
// byte of what arrived without the sender shipping a copy alongside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace gradlane::testing {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Byte at absolute position `index` of the stream for `seed` (independent of where a slice starts).
inline std::byte pattern_byte(std::uint64_t seed, std::uint64_t index) {
  return static_cast<std::byte>(splitmix64(seed * 0x100000001b3ull + (index >> 3)) >> (8 * (index & 7)));
}

inline void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::uint64_t first_index = 0) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = pattern_byte(seed, first_index + i);
}

// nullopt when every byte matches, else a description of the first mismatch.
inline std::optional<std::string> check_pattern(std::span<const std::byte> in, std::uint64_t seed,
                                                std::uint64_t first_index = 0) {
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::byte want = pattern_byte(seed, first_index + i);
    if (in[i] != want) {
      return "mismatch at byte " + std::to_string(i) + " of " + std::to_string(in.size()) + ": got " +
             std::to_string(static_cast<unsigned>(in[i])) + " want " + std::to_string(static_cast<unsigned>(want));
    }
  }
  return std::nullopt;
}

}  // namespace gradlane::testing
