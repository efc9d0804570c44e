// Grant tokens (include/gradlane/sidecar.hpp): what gradlaned stamps on a keyed receiver's
// grants and what its server checks a worker's claim against. libsodium's crypto_shorthash is
// SipHash-2-4: a keyed pseudo-random function, fast on 8-byte inputs (one per grant).
#include <sodium.h>

#include <array>
#include <cstring>

#include "gradlane/error.hpp"
#include "gradlane/sidecar.hpp"

namespace gradlane::sidecar {

static_assert(crypto_shorthash_KEYBYTES == sizeof(GrantKey) && crypto_shorthash_BYTES == sizeof(std::uint64_t));

GrantKey random_grant_key() {
  // sodium_init: idempotent and thread-safe; it opens the kernel's random source.
  if (sodium_init() < 0) {
    throw Error(Errc::resource_exhausted, "libsodium could not be initialised: no random source for a grant key");
  }
  GrantKey key{};
  randombytes_buf(key.data(), key.size());
  return key;
}

std::uint64_t grant_token(const GrantKey& key, std::uint64_t sequence) noexcept {
  std::array<unsigned char, 8> in{};
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(sequence >> (8 * i));  // little-endian
  std::array<unsigned char, crypto_shorthash_BYTES> out{};
  crypto_shorthash(out.data(), in.data(), in.size(), key.data());
  std::uint64_t token = 0;
  for (std::size_t i = 0; i < out.size(); ++i) token |= std::uint64_t{out[i]} << (8 * i);
  return token == 0 ? 1 : token;  // 0 means "no token" on the wire
}

}  // namespace gradlane::sidecar
