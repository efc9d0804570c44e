// The data path over real rxe between two processes, every byte verified.
#include <algorithm>

#include <gtest/gtest.h>

#include "../common/pattern.hpp"
#include "harness.hpp"

namespace gradlane::testing {
namespace {

class WriteSizes : public PeerTest, public ::testing::WithParamInterface<std::size_t> {};

TEST_P(WriteSizes, WriteArrivesByteForByte) {
  const std::size_t size = GetParam();
  start_peer(size + 4096);
  Buffer src = Buffer::allocate(size);
  fill_pattern(src.bytes(), size);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  // Offset 7 in the target: unaligned placement must work too.
  const std::size_t offset = 7;
  conn->wait(conn->write(mr, 0, peer_region, offset, size, Signal::always), 60s);
  EXPECT_EQ(command("verify " + std::to_string(offset) + " " + std::to_string(size) + " " + std::to_string(size)), "ok");
  stop_peer();
}

INSTANTIATE_TEST_SUITE_P(Sizes, WriteSizes,
                         ::testing::Values(std::size_t{1}, std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 20,
                                           std::size_t{8} << 20),
                         [](const auto& param_info) { return std::to_string(param_info.param) + "B"; });

TEST_F(PeerTest, WriteWithImmPayloadIsVisibleWhenTheDoorbellCompletes) {
  // The push protocol: payload by plain WRITE (unsignalled), then a WRITE_WITH_IMM doorbell.
  // The peer checks, on each doorbell completion, that the slot holds the full payload.
  constexpr std::size_t kSlot = 1024, kSlots = 16, kIterations = 10'000;
  start_peer(kSlot * kSlots);
  Buffer src = Buffer::allocate(kSlot * kSlots);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  send_text(*conn, "doorbells 10000 1024 16");
  for (std::size_t i = 0; i < kIterations; ++i) {
    const std::size_t off = (i % kSlots) * kSlot;
    // Payload minus its last 8 bytes by plain WRITE; the last 8 ride in the doorbell itself.
    fill_pattern({src.data() + off, kSlot}, i);
    conn->write(mr, off, peer_region, off, kSlot - 8);
    conn->write_with_imm(mr, off + kSlot - 8, peer_region, off + kSlot - 8, 8, static_cast<std::uint32_t>(i),
                         Signal::automatic);
    if ((i + 1) % kSlots == 0) {
      // The peer hands the slots back once it verified them; our source slots are reusable
      // only once our writes completed, which its verification proves.
      auto credit = conn->receive(60s);
      ASSERT_EQ(text_of(credit), "credit") << "at " << i;
    }
  }
  auto done = conn->receive(60s);
  EXPECT_EQ(text_of(done), "ok 10000");
  EXPECT_GE(conn->stats().posted, 2 * kIterations);
  stop_peer();
}

TEST_F(PeerTest, WriteAndRingPlacesThePayloadBeforeItsZeroLengthDoorbell) {
  // The library's push: payload WRITE chained with a zero-length WRITE_WITH_IMM in one post.
  // The peer checks, at each doorbell, the immediate and that the whole slot holds its pattern.
  constexpr std::size_t kSlot = 4096, kSlots = 8, kIterations = 2'000;
  start_peer(kSlot * kSlots);
  Buffer src = Buffer::allocate(kSlot * kSlots);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  send_text(*conn, "doorbells 2000 4096 8");
  const std::uint64_t posted_before = conn->stats().posted;
  for (std::size_t i = 0; i < kIterations; ++i) {
    const std::size_t off = (i % kSlots) * kSlot;
    fill_pattern({src.data() + off, kSlot}, i);
    conn->write_and_ring(mr, off, peer_region, off, kSlot, static_cast<std::uint32_t>(i));
    if ((i + 1) % kSlots == 0) {
      ASSERT_EQ(text_of(conn->receive(60s)), "credit") << "at " << i;
    }
  }
  EXPECT_EQ(text_of(conn->receive(60s)), "ok 2000");
  // Two work requests per push, and the doorbell of each is signalled.
  EXPECT_EQ(conn->stats().posted - posted_before, 2 * kIterations);
  EXPECT_GE(conn->stats().signalled, kIterations);
  stop_peer();
}

TEST_F(PeerTest, ZeroLengthWriteWithImmIsADoorbell) {
  // A doorbell with no payload is what verbs allow and the push uses; the peer's check of slot
  // 0 passes because the payload went first by a plain WRITE.
  start_peer(4096);
  Buffer src = Buffer::allocate(4096);
  fill_pattern(src.bytes(), 0);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  send_text(*conn, "doorbells 1 4096 1");
  conn->write(mr, 0, peer_region, 0, 4096);
  conn->wait(conn->write_with_imm(mr, 0, peer_region, 4096, 0, /*imm=*/0), 60s);
  EXPECT_EQ(text_of(conn->receive(60s)), "credit");
  EXPECT_EQ(text_of(conn->receive(60s)), "ok 1");
  stop_peer();
}

TEST_F(PeerTest, ReadReturnsThePeersBytes) {
  constexpr std::size_t kBytes = 1u << 20;
  start_peer(kBytes);
  ASSERT_EQ(command("fill 0 " + std::to_string(kBytes) + " 77"), "ok");
  Buffer dst = Buffer::allocate(kBytes);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, dst, Access::local_write);
  conn->wait(conn->read(mr, 0, peer_region, 0, kBytes), 60s);
  EXPECT_EQ(check_pattern(dst.bytes(), 77), std::nullopt);
  // A small read from the middle, into the middle of our buffer.
  std::fill_n(dst.data(), kBytes, std::byte{0});
  conn->wait(conn->read(mr, 100, peer_region, 5000, 333), 60s);
  EXPECT_EQ(check_pattern({dst.data() + 100, 333}, 77, 5000), std::nullopt);
  EXPECT_EQ(dst.data()[99], std::byte{0});
  EXPECT_EQ(dst.data()[433], std::byte{0});
  stop_peer();
}

TEST_F(PeerTest, SendRecvRoundTripsInOrder) {
  start_peer(4096);
  for (std::size_t size : {0u, 1u, 100u, 1000u, 4000u}) {
    std::string payload(size, '\0');
    for (std::size_t i = 0; i < size; ++i) payload[i] = static_cast<char>(pattern_byte(size, i));
    EXPECT_EQ(command("echo " + payload), payload) << size << " bytes";
  }
  // Many in flight before any reply is read: order must hold.
  for (int i = 0; i < 50; ++i) {
    const std::string m = "echo " + std::to_string(i);
    send_text(*conn, m);
  }
  for (int i = 0; i < 50; ++i) {
    auto reply = conn->receive(30s);
    EXPECT_EQ(text_of(reply), std::to_string(i));
  }
  EXPECT_GE(conn->stats().messages_received, 55u);
  stop_peer();
}

TEST_F(PeerTest, OversizedMessageIsRefusedLocally) {
  start_peer(4096);
  std::vector<std::byte> big(conn->options().max_message_bytes, std::byte{1});
  try {
    conn->send(big);
    FAIL() << "sent a message larger than the limit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
  EXPECT_FALSE(conn->failed());
  stop_peer();
}

TEST_F(PeerTest, ManyOutstandingUnsignalledWritesDrainTheSendQueue) {
  // 4 × the send-queue depth of unsignalled writes: only the periodic signalled ones free
  // the queue. Every write lands in its own slot; the peer verifies all of them.
  constexpr std::size_t kWrite = 4096;
  const std::size_t count = 4 * test_options().send_queue_depth;
  start_peer(kWrite * count);
  Buffer src = Buffer::allocate(kWrite * count);
  fill_pattern(src.bytes(), 4242);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  std::uint64_t max_outstanding = 0;
  for (std::size_t i = 0; i < count; ++i) {
    conn->write(mr, i * kWrite, peer_region, i * kWrite, kWrite);
    max_outstanding = std::max(max_outstanding, conn->outstanding());
  }
  EXPECT_LE(max_outstanding, test_options().send_queue_depth);
  EXPECT_GT(max_outstanding, test_options().signal_interval) << "writes never overlapped";
  conn->write(mr, 0, peer_region, 0, kWrite, Signal::always);
  conn->flush(60s);
  EXPECT_EQ(conn->outstanding(), 0u);
  EXPECT_LT(conn->stats().signalled, count / 4) << "too many writes were signalled";
  EXPECT_EQ(command("verify 0 " + std::to_string(kWrite * count) + " 4242"), "ok");
  stop_peer();
}

TEST_F(PeerTest, TwoQueuePairsAtOnce) {
  constexpr std::size_t kHalf = 256 * 1024;
  start_peer(2 * kHalf);
  // The peer's second connect completes only once we accept it, so accept before the reply.
  send_text(*conn, "connect_again");
  Connection second = listener->accept(30s);
  ASSERT_EQ(text_of(conn->receive(30s)), "ok");
  const RegionDescriptor second_region = second.wait_region(1, 30s);
  EXPECT_EQ(second_region, peer_region);
  Buffer src = Buffer::allocate(2 * kHalf);
  fill_pattern(src.bytes(), 555);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  // Interleave 16 KiB chunks: first half through QP 1, second half through QP 2.
  for (std::size_t off = 0; off < kHalf; off += 16384) {
    conn->write(mr, off, peer_region, off, 16384);
    second.write(mr, kHalf + off, second_region, kHalf + off, 16384);
  }
  conn->wait(conn->write(mr, 0, peer_region, 0, 16384, Signal::always), 60s);
  second.wait(second.write(mr, kHalf, second_region, kHalf, 16384, Signal::always), 60s);
  EXPECT_EQ(command("verify 0 " + std::to_string(2 * kHalf) + " 555"), "ok");
  EXPECT_EQ(command(second, "verify 0 16 555"), "ok") << "commands over the second QP";
  stop_peer();
}

TEST_F(PeerTest, PeerWritesIntoOurAdvertisedRegion) {
  constexpr std::size_t kBytes = 256 * 1024;
  start_peer(kBytes);
  Buffer ours = Buffer::allocate(kBytes);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, ours, Access::remote_write);
  conn->advertise(2, mr.descriptor());
  EXPECT_EQ(command("push 2 0 " + std::to_string(kBytes) + " 31337"), "ok");
  EXPECT_EQ(check_pattern(ours.bytes(), 31337), std::nullopt);
  stop_peer();
}

TEST_F(PeerTest, HugepageBackedBufferCarriesWrites) {
  // Reserve a few 2 MiB pages (we are root in the VM) so the MAP_HUGETLB path is exercised.
  if (FILE* f = std::fopen("/proc/sys/vm/nr_hugepages", "w")) {
    std::fputs("4", f);
    std::fclose(f);
  }
  constexpr std::size_t kBytes = 4u << 20;
  Buffer src = Buffer::allocate(kBytes, Buffer::Pages::huge_only);
  EXPECT_TRUE(src.on_hugepages());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(src.data()) % (2u << 20), 0u);
  start_peer(kBytes);
  fill_pattern(src.bytes(), 2024);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  conn->wait(conn->write(mr, 0, peer_region, 0, kBytes, Signal::always), 60s);
  EXPECT_EQ(command("verify 0 " + std::to_string(kBytes) + " 2024"), "ok");
  stop_peer();
}

}  // namespace
}  // namespace gradlane::testing
