#include "ps/protocol/model_version.hpp"

#include <exception>

#include <xxhash.h>

#include "gradlane/error.hpp"

namespace gradlane::ps {

std::uint64_t payload_checksum(std::span<const float> payload, std::uint64_t version) noexcept {
  return XXH3_64bits_withSeed(payload.data(), payload.size_bytes(), version);
}

ShardWriter::ShardWriter(ShardHeader& header, std::span<const float> payload, std::uint64_t model_version) noexcept
    : header_(header), payload_(payload) {
  publish(model_version);
}

void ShardWriter::publish(std::uint64_t model_version) noexcept {
  model_version_ = model_version;
  std::atomic_ref<std::uint64_t>(header_.model_version).store(model_version, std::memory_order_relaxed);
  header_.checksum.store(payload_checksum(payload_, 2 * model_version), std::memory_order_relaxed);
  // Release: model_version (and a restored payload) are visible before the even version.
  header_.version.store(2 * model_version, std::memory_order_release);
  applying_ = false;
}

void ShardWriter::begin_apply() {
  if (applying_) {
    throw Error(Errc::invalid_argument,
                "ShardWriter::begin_apply: the previous apply did not end (an abandoned apply needs restore())");
  }
  applying_ = true;
  header_.version.store(2 * model_version_ + 1, std::memory_order_release);
  // The store above cannot be overtaken by later stores to it, but a release store does not
  // keep *later* stores after it. This fence does: a reader that sees any payload store of
  // this apply then sees the odd version (or a later one) in its closing header read.
  std::atomic_thread_fence(std::memory_order_release);
}

void ShardWriter::end_apply() {
  if (!applying_) throw Error(Errc::invalid_argument, "ShardWriter::end_apply: no apply in progress");
  publish(model_version_ + 1);
}

void ShardWriter::restore(std::uint64_t model_version) noexcept { publish(model_version); }

ApplyGuard::ApplyGuard(ShardWriter& writer) : writer_(writer), exceptions_at_entry_(std::uncaught_exceptions()) {
  writer_.begin_apply();
}

ApplyGuard::~ApplyGuard() {
  // Unwinding: the payload may be half-written; leave the shard odd so no reader accepts it.
  if (std::uncaught_exceptions() > exceptions_at_entry_) return;
  writer_.end_apply();
}

}  // namespace gradlane::ps
