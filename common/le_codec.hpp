// The one little-endian codec of gradlane's wire formats (the parameter server's messages,
// the sidecars' peer messages): fixed-width integers, enums and doubles, least significant
// byte first, packed. A reader never reads past its input: a short message is an
// Error(protocol) naming the field it ended in, never a read out of bounds.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gradlane/error.hpp"

namespace gradlane::wire {

class LeWriter {
 public:
  explicit LeWriter(std::size_t reserve = 0) { out_.reserve(reserve); }

  template <class T>
  LeWriter& put(T value) {
    static_assert(std::is_integral_v<T> || std::is_enum_v<T> || std::is_same_v<T, double>);
    if constexpr (std::is_same_v<T, double>) {
      return put(std::bit_cast<std::uint64_t>(value));
    } else {
      for (std::size_t i = 0; i < sizeof(T); ++i) {
        out_.push_back(static_cast<std::byte>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xff));
      }
      return *this;
    }
  }
  // `text`, NUL-padded to exactly `size` bytes; Error(invalid_argument) when it is longer.
  LeWriter& put_text(std::string_view text, std::size_t size) {
    if (text.size() > size) {
      throw Error(Errc::invalid_argument,
                  "'" + std::string(text) + "' is longer than " + std::to_string(size) + " bytes");
    }
    for (std::size_t i = 0; i < size; ++i)
      out_.push_back(i < text.size() ? static_cast<std::byte>(text[i]) : std::byte{0});
    return *this;
  }
  std::size_t size() const noexcept { return out_.size(); }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class LeReader {
 public:
  // `what` (and `number`, if any) names the message in errors: "peer message",
  // "parameter-server message of kind" 3. Nothing is formatted unless there is an error.
  LeReader(std::span<const std::byte> in, std::string_view what, std::optional<std::uint64_t> number = std::nullopt)
      : in_(in), what_(what), number_(number) {}

  template <class T>
  T get(const char* field = nullptr) {
    static_assert(std::is_integral_v<T> || std::is_enum_v<T> || std::is_same_v<T, double>);
    if constexpr (std::is_same_v<T, double>) {
      return std::bit_cast<double>(get<std::uint64_t>(field));
    } else {
      const std::span<const std::byte> b = take(sizeof(T), field);
      std::uint64_t v = 0;
      for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::to_integer<std::uint64_t>(b[i]) << (8 * i);
      return static_cast<T>(v);
    }
  }
  // The next `n` bytes as they are.
  std::span<const std::byte> take(std::size_t n, const char* field = nullptr) {
    if (in_.size() - pos_ < n) {
      throw Error(Errc::protocol, name() + " truncated at field '" + (field ? field : "byte " + std::to_string(pos_)) +
                                      "' (" + std::to_string(in_.size()) + " bytes)");
    }
    const auto b = in_.subspan(pos_, n);
    pos_ += n;
    return b;
  }
  std::size_t remaining() const noexcept { return in_.size() - pos_; }
  // Error(protocol) when bytes are left over: every field was read, the message is longer.
  // `what`: the message's name in the error, if not the reader's.
  void expect_end(std::string_view what = {}) const {
    if (pos_ != in_.size()) {
      throw Error(Errc::protocol, (what.empty() ? name() : std::string(what)) + " has " +
                                      std::to_string(in_.size() - pos_) + " trailing bytes");
    }
  }

 private:
  std::string name() const { return std::string(what_) + (number_ ? " " + std::to_string(*number_) : std::string()); }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  std::string_view what_;
  std::optional<std::uint64_t> number_;
};

}  // namespace gradlane::wire
