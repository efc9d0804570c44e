// The shard seqlock: the writer's version protocol and checksum, the reader's acceptance rule,
// and two-thread tests in which a reader takes snapshots the way the worker's three READs do —
// in order, and in the order a NIC may serve them, payload first — while a writer applies
// updates in a loop; every accepted snapshot must be exactly the payload of the model version
// it claims.
//
// In-process the payload is read while it is written, so both sides go through
// std::atomic_ref<float/uint64_t> with relaxed order: plain loads and stores in the generated
// code, but no data race for the language (or TSan). The ordering comes only from the
// seqlock's own fences, as it would over RDMA.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gradlane/error.hpp"
#include "ps/protocol/model_version.hpp"

namespace gradlane::ps {
namespace {

TEST(ConsistentSnapshot, OnlyTheSameEvenVersionOnBothSides) {
  EXPECT_TRUE(consistent_snapshot(0, 0));
  EXPECT_TRUE(consistent_snapshot(42, 42));
  EXPECT_FALSE(consistent_snapshot(43, 43));  // read during an apply
  EXPECT_FALSE(consistent_snapshot(42, 43));  // an apply began during the read
  EXPECT_FALSE(consistent_snapshot(42, 44));  // an apply began and ended
  EXPECT_FALSE(consistent_snapshot(41, 42));  // an apply ended during the read
}

TEST(ShardWriter, VersionIsTwiceTheAppliedUpdatesAndOddWhileApplying) {
  ShardHeader header;
  ShardWriter writer(header, {}, 5);
  EXPECT_EQ(header.version.load(), 10u);
  EXPECT_EQ(header.model_version, 5u);
  writer.begin_apply();
  EXPECT_TRUE(writer.applying());
  EXPECT_EQ(header.version.load(), 11u);
  EXPECT_EQ(header.model_version, 5u);
  writer.end_apply();
  EXPECT_FALSE(writer.applying());
  EXPECT_EQ(header.version.load(), 12u);
  EXPECT_EQ(header.model_version, 6u);
  EXPECT_EQ(writer.model_version(), 6u);
  {
    ApplyGuard guard(writer);
    EXPECT_EQ(header.version.load(), 13u);
  }
  EXPECT_EQ(header.version.load(), 14u);
  EXPECT_EQ(header.model_version, 7u);
}

TEST(ShardWriter, ASkippedSequenceCountsInTheVersionAndLeavesItEven) {
  // The version is the last sequence decided: the sidecar's staleness counts holes too, and a
  // version that did not would fall one behind per hole (a promoted replica skips `slots`).
  ShardHeader header;
  ShardWriter writer(header, {}, 5);
  writer.skip();
  EXPECT_EQ(writer.model_version(), 6u);
  EXPECT_EQ(header.model_version, 6u);
  EXPECT_EQ(header.version.load(), 12u);
}

TEST(ShardWriter, MisorderedCallsAreRefused) {
  ShardHeader header;
  ShardWriter writer(header, {});
  EXPECT_THROW(writer.end_apply(), Error);
  EXPECT_EQ(header.version.load(), 0u);
  writer.begin_apply();
  EXPECT_THROW(writer.begin_apply(), Error);
  EXPECT_EQ(header.version.load(), 1u);
}

TEST(ShardWriter, AnApplyLeftByAnExceptionStaysUnreadableUntilRestored) {
  ShardHeader header;
  ShardWriter writer(header, {}, 3);
  try {
    ApplyGuard guard(writer);
    throw std::runtime_error("apply failed half-way");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(header.version.load(), 7u);  // odd: no reader accepts the torn payload
  EXPECT_FALSE(consistent_snapshot(header.version.load(), header.version.load()));
  EXPECT_THROW(writer.begin_apply(), Error);
  writer.restore(3);  // e.g. copied back from the replica at version 3
  EXPECT_EQ(header.version.load(), 6u);
  EXPECT_EQ(header.model_version, 3u);
  writer.begin_apply();
  writer.end_apply();
  EXPECT_EQ(header.version.load(), 8u);
}

TEST(ShardWriter, EveryPublishChecksumsThePayloadWithItsVersion) {
  ShardHeader header;
  std::vector<float> payload(64, 1.0F);
  ShardWriter writer(header, payload, 2);
  EXPECT_EQ(header.checksum.load(), payload_checksum(payload, 4));
  writer.begin_apply();
  payload[7] = 2.0F;
  writer.end_apply();
  EXPECT_EQ(header.checksum.load(), payload_checksum(payload, 6));
  writer.skip();  // the same floats, a new version: a new checksum
  EXPECT_EQ(header.checksum.load(), payload_checksum(payload, 8));
  EXPECT_NE(payload_checksum(payload, 6), payload_checksum(payload, 8));
  payload[0] = 3.0F;  // e.g. copied back from the replica
  writer.restore(9);
  EXPECT_EQ(header.checksum.load(), payload_checksum(payload, 18));
}

TEST(SnapshotHolds, OnlyThePayloadPublishedWithTheFirstHeadersVersion) {
  ShardHeader header;
  std::vector<float> payload(256);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<float>(i);
  ShardWriter writer(header, payload, 10);
  const std::uint64_t v = header.version.load(), checksum = header.checksum.load();
  const std::vector<float> old = payload;
  EXPECT_TRUE(snapshot_holds(v, checksum, old, v));
  {
    ApplyGuard apply(writer);
    for (float& x : payload) x += 0.5F;
  }
  // A NIC that served the payload READ after the apply but both header READs before it: the
  // version words agree, which is all the in-order check looks at.
  ASSERT_TRUE(consistent_snapshot(v, v));
  EXPECT_FALSE(snapshot_holds(v, checksum, payload, v));
  // Half old, half new, under headers of either version.
  std::vector<float> torn = old;
  std::copy(payload.begin() + 128, payload.end(), torn.begin() + 128);
  EXPECT_FALSE(snapshot_holds(v, checksum, torn, v));
  EXPECT_FALSE(snapshot_holds(header.version.load(), header.checksum.load(), torn, header.version.load()));
  // The new version read whole holds; an odd or changed version still does not.
  EXPECT_TRUE(snapshot_holds(header.version.load(), header.checksum.load(), payload, header.version.load()));
  EXPECT_FALSE(snapshot_holds(header.version.load(), header.checksum.load(), payload, header.version.load() + 2));
}

// The payload of model version m: every element depends on m, so a copy that mixes two
// versions (a torn read) cannot match either. Values stay below 2^24, exact in a float.
float payload_value(std::uint64_t m, std::size_t i) {
  return static_cast<float>(((m * 2654435761u) ^ (i * 40503u)) & 0xFFFFFu);
}

struct Shard {
  ShardHeader header;
  std::vector<float> payload = std::vector<float>(2048);
};

// What the worker's READ 1 (header), READ 2 (payload) and READ 3 (header) return, in order.
struct Snapshot {
  std::uint64_t v1 = 0, v2 = 0, model_version = 0, checksum = 0;
  std::vector<float> payload;
};

void read_header(Shard& shard, Snapshot& s) {
  s.v1 = shard.header.version.load(std::memory_order_acquire);
  s.model_version = std::atomic_ref<std::uint64_t>(shard.header.model_version).load(std::memory_order_relaxed);
  s.checksum = shard.header.checksum.load(std::memory_order_relaxed);
}

void read_payload(Shard& shard, Snapshot& s) {
  for (std::size_t i = 0; i < shard.payload.size(); ++i) {
    s.payload[i] = std::atomic_ref<float>(shard.payload[i]).load(std::memory_order_relaxed);
  }
}

// In order: header, payload, header.
void read_like_rdma(Shard& shard, Snapshot& s) {
  read_header(shard, s);
  read_payload(shard, s);
  // The payload loads may not be reordered after the second version load.
  std::atomic_thread_fence(std::memory_order_acquire);
  s.v2 = shard.header.version.load(std::memory_order_relaxed);
}

// As a NIC may serve the three READs: the payload first, then both headers.
void read_payload_first(Shard& shard, Snapshot& s) {
  read_payload(shard, s);
  std::atomic_thread_fence(std::memory_order_acquire);
  read_header(shard, s);
  s.v2 = shard.header.version.load(std::memory_order_relaxed);
}

// Reads snapshots with `read` while a writer applies updates; returns the torn ones accepted.
template <class Read>
int accepted_torn_snapshots(Read read, const char* how) {
  Shard shard;
  ShardWriter writer(shard.header, shard.payload);
  std::atomic<bool> stop{false};
  std::jthread server([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      {
        ApplyGuard apply(writer);
        const std::uint64_t next = writer.model_version() + 1;
        for (std::size_t i = 0; i < shard.payload.size(); ++i) {
          std::atomic_ref<float>(shard.payload[i]).store(payload_value(next, i), std::memory_order_relaxed);
        }
      }
      // Idle about as long as an apply takes (a spin, not a clock), so reads land both inside
      // and between applies and many snapshots are accepted and checked.
      for (std::size_t i = 0; i < shard.payload.size() && !stop.load(std::memory_order_relaxed); ++i) {
      }
    }
  });

  constexpr int kReads = 200'000;
  Snapshot s;
  s.payload.resize(shard.payload.size());
  int accepted = 0, torn = 0;
  std::uint64_t last_version = 0;
  for (int r = 0; r < kReads && torn == 0; ++r) {
    read(shard, s);
    if (!snapshot_holds(s.v1, s.checksum, s.payload, s.v2)) continue;
    ++accepted;
    const std::uint64_t m = s.v1 / 2;
    EXPECT_EQ(s.model_version, m) << "read " << r;
    EXPECT_GE(m, last_version) << "a snapshot went back in time";
    last_version = m;
    for (std::size_t i = 0; i < s.payload.size(); ++i) {
      if (s.payload[i] != (m == 0 ? 0.0F : payload_value(m, i))) {
        ADD_FAILURE() << "read " << r << " accepted version " << m << " but element " << i << " is " << s.payload[i]
                      << ", expected " << payload_value(m, i);
        ++torn;
        break;
      }
    }
  }
  stop.store(true);
  server.join();
  EXPECT_GT(accepted, 0) << how << ": nothing was checked";
  EXPECT_GT(writer.model_version(), 0u);
  std::printf("[ info     ] %s: %d of %d snapshots accepted, %llu updates applied meanwhile\n", how, accepted, kReads,
              static_cast<unsigned long long>(writer.model_version()));
  return torn;
}

TEST(ShardSeqlock, EveryAcceptedSnapshotIsOneWholeVersion) {
  EXPECT_EQ(accepted_torn_snapshots(read_like_rdma, "in order"), 0);
}

TEST(ShardSeqlock, EveryAcceptedSnapshotIsOneWholeVersionWhateverOrderTheReadsRanIn) {
  EXPECT_EQ(accepted_torn_snapshots(read_payload_first, "payload first"), 0);
}

}  // namespace
}  // namespace gradlane::ps
