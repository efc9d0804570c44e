// Consistent pulls of a model shard that the server may be updating: a seqlock a worker can
// check through one-sided RDMA READs, with no server CPU on the pull path.
//
// A shard region starts with a 64-byte ShardHeader, followed by the payload (the floats).
//   server  begin_apply(): version = version + 1 (odd: an apply is in progress), then a release
//           fence so no payload store can become visible before the odd version;
//           … apply the update to the payload, count it in model_version …
//           end_apply():   version = version + 1 (even: stable), a release store, so the payload
//           and model_version are visible before the even version is.
//   worker  posts three READs on one RC QP: header → v1, payload, header → v2.
//           consistent_snapshot(v1, v2) rejects a read during which an apply started or was in
//           progress (v1 != v2, or odd) — but only if the NIC executed the three READs in
//           order, which neither IB nor PCIe promises (a READ response may be served from
//           memory out of order with the next request's). So every publish also stores a
//           checksum of the payload seeded with the version (payload_checksum), and the worker
//           accepts a copy only if the payload it holds hashes to the checksum of the first
//           header it read (snapshot_holds): whatever the order of the READs, the payload is then
//           exactly that version's. Otherwise it reads again (an apply of a 4 MiB shard takes
//           about a millisecond).
//
// Version and applied updates: the shard is published with version = 2 × model_version, and
// every apply (or skipped sequence) adds 2, so in an accepted snapshot model_version == v1 / 2 —
// the number of sequences decided in this shard (the worker's staleness input). An odd version means model
// version v / 2 is being turned into v / 2 + 1.
//
// In-process (tests, a co-located reader) the payload and model_version are read while the
// server may be writing them; they must then be accessed through std::atomic_ref with relaxed
// order, which compiles to plain loads and stores and keeps the program free of data races.
// ShardWriter itself writes model_version that way.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace gradlane::ps {

struct alignas(64) ShardHeader {
  // Even: stable; odd: an apply is in progress. What the worker's first and last READs fetch.
  std::atomic<std::uint64_t> version{0};
  // Sequences decided (applied or skipped) in this shard. Written only by ShardWriter.
  std::uint64_t model_version = 0;
  // A replica promoted in sidecar mode refuses the doorbells of sequences below this (the old
  // owner's grants, see ps.hpp); ~0 while the promotion is under way. A worker that failed
  // over READs it after each write: a sequence below it was refused, the push is lost.
  std::atomic<std::uint64_t> refuse_below{0};
  // ShardOptions::clock_workers: the slowest worker's clock (receiving/worker_clocks.hpp), which
  // only grows; 0 without clocks. Outside the seqlock: any value a READ sees was true lately.
  std::atomic<std::uint64_t> slowest_clock{0};
  // payload_checksum(payload, version) of the payload as published at the even `version`.
  // Written before the version that it goes with, read by workers only as a pair with it.
  std::atomic<std::uint64_t> checksum{0};
  // ShardOptions::tensor, written before the shard is advertised and never again: a worker
  // READs it once when it connects and refuses a shard of another tensor.
  std::uint64_t tensor = 0;
};
static_assert(sizeof(ShardHeader) == 64, "one cache line, read as one 64-byte RDMA READ");
static_assert(std::is_standard_layout_v<ShardHeader>, "its bytes are read over the wire");
static_assert(offsetof(ShardHeader, version) == 0 && offsetof(ShardHeader, model_version) == 8 &&
              offsetof(ShardHeader, refuse_below) == 16 && offsetof(ShardHeader, slowest_clock) == 24 &&
              offsetof(ShardHeader, checksum) == 32 && offsetof(ShardHeader, tensor) == 40);
// The READ sees the word's bytes, so it must be a plain 8-byte word, not a lock.
static_assert(std::atomic<std::uint64_t>::is_always_lock_free &&
              sizeof(std::atomic<std::uint64_t>) == sizeof(std::uint64_t));

// Accept a payload read between header reads that returned v1 and v2 (if the READs ran in order).
constexpr bool consistent_snapshot(std::uint64_t v1, std::uint64_t v2) noexcept { return v1 == v2 && v1 % 2 == 0; }

// XXH3-64 of the payload's bytes, seeded with the header's (even) version word: a copy of one
// version's payload never matches another version's checksum, even where the floats are equal.
std::uint64_t payload_checksum(std::span<const float> payload, std::uint64_t version) noexcept;

// A pulled copy: the first header's version word and checksum, the payload, the second header's
// version word. Holds on any NIC, whatever the order its READs ran in: the payload is exactly the
// one published with v1, and no apply was under way at either header read.
inline bool snapshot_holds(std::uint64_t v1, std::uint64_t checksum1, std::span<const float> payload,
                           std::uint64_t v2) noexcept {
  return consistent_snapshot(v1, v2) && payload_checksum(payload, v1) == checksum1;
}

// The server side; the one writer of a shard's header. Not thread-safe (one applier per shard).
class ShardWriter {
 public:
  // Publishes `payload` at `model_version` as stable. Call before any worker may read the shard.
  // The payload is the shard's floats, which applies change between begin_apply() and
  // end_apply() only (or before a restore()): each publish checksums them.
  ShardWriter(ShardHeader& header, std::span<const float> payload, std::uint64_t model_version = 0) noexcept;

  // Throws Error(invalid_argument) if an apply is already in progress (or was abandoned).
  void begin_apply();
  // Counts one more applied update and publishes the payload as stable. Throws
  // Error(invalid_argument) if no apply is in progress.
  void end_apply();
  // After an apply that did not finish (the shard stays odd, so no reader accepts it) and the
  // payload was restored, e.g. from the replica: publishes it as stable at `model_version`.
  void restore(std::uint64_t model_version) noexcept;
  // A skipped sequence (a hole): the payload is unchanged, the version counts it too — the
  // version is the last sequence decided, which is what the sidecar's staleness counts
  // (a version that counted applies only would fall behind by every hole).
  void skip() noexcept { publish(model_version_ + 1); }

  bool applying() const noexcept { return applying_; }
  std::uint64_t model_version() const noexcept { return model_version_; }

 private:
  void publish(std::uint64_t model_version) noexcept;

  ShardHeader& header_;
  std::span<const float> payload_;
  std::uint64_t model_version_ = 0;  // the writer's own copy: it never reads the shared header
  bool applying_ = false;
};

// Scope of one apply. If the scope is left by an exception the payload may be half-written,
// so the shard stays marked in progress (readers keep retrying, never accept it) until
// ShardWriter::restore(); a normal exit ends the apply.
class ApplyGuard {
 public:
  explicit ApplyGuard(ShardWriter& writer);
  ~ApplyGuard();
  ApplyGuard(const ApplyGuard&) = delete;
  ApplyGuard& operator=(const ApplyGuard&) = delete;

 private:
  ShardWriter& writer_;
  int exceptions_at_entry_;
};

}  // namespace gradlane::ps
