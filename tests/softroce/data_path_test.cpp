// The data path over real rxe between two processes, every byte verified.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstring>

#include <gtest/gtest.h>

#include "../common/pattern.hpp"
#include "harness.hpp"

namespace gradlane::testing {
namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds this thread has used.
double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

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
  EXPECT_EQ(command("verify " + std::to_string(offset) + " " + std::to_string(size) + " " + std::to_string(size)),
            "ok");
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

// A wait that lasts gives its core away: waits that spin without pause let 32 workers waiting
// for their grants on 2 vCPUs starve the server thread and rxe's own work (the 32-worker load
// test, tests/ps/many_workers_softroce_test.cpp: 11.6 updates/s, 0.15 of one worker's rate,
// against 0.81 with waits that nap). Here a receive() that waits 1 s for nothing may use at most
// a quarter of that in CPU (a spinning wait uses all of it, 1.005 s; a napping one about
// 0.01-0.1 s under TCG, where each look between naps costs tens of microseconds).
TEST_F(PeerTest, ALongWaitDoesNotBurnACore) {
  start_peer(4096);
  const double cpu0 = thread_cpu_seconds();
  const auto wall0 = std::chrono::steady_clock::now();
  try {
    conn->receive(1s);
    ADD_FAILURE() << "the peer sent nothing, yet a message came";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout) << e.what();
  }
  const double cpu = thread_cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  RecordProperty("cpu_seconds_in_1s_wait", std::to_string(cpu));
  EXPECT_GE(wall, 1.0);
  EXPECT_LT(cpu, 0.25) << "a 1 s wait used " << cpu << " s of CPU";
  stop_peer();
}

TEST_F(PeerTest, WaitForActivitySleepsUntilAMessageOrTheDisconnectComes) {
  // A connection with its own completion queue sleeps on its completion channel: an idle wait
  // costs no CPU, a message wakes it long before its timeout (a lost wake-up would sleep the
  // whole 20 s), and so does the peer leaving.
  start_peer(4096);
  const double cpu0 = thread_cpu_seconds();
  auto start = Clock::now();
  EXPECT_FALSE(conn->wait_for_activity(1s)) << "nothing was sent, yet it woke";
  const double idle_cpu = thread_cpu_seconds() - cpu0;
  EXPECT_GE(seconds_since(start), 0.99);
  RecordProperty("cpu_seconds_in_1s_wait_for_activity", std::to_string(idle_cpu));
  EXPECT_LT(idle_cpu, 0.02) << "an idle 1 s wait_for_activity used " << idle_cpu << " s of CPU";

  send_text(*conn, "echo woken");
  start = Clock::now();
  std::optional<std::vector<std::byte>> reply;
  while (!(reply = conn->try_receive()) && seconds_since(start) < 20.0) conn->wait_for_activity(20s);
  ASSERT_TRUE(reply.has_value()) << "no reply within 20 s";
  EXPECT_EQ(text_of(*reply), "woken");
  EXPECT_LT(seconds_since(start), 10.0) << "the reply did not wake the wait";

  send_text(*conn, "exit");
  start = Clock::now();
  while (!(reply = conn->try_receive()) && seconds_since(start) < 20.0) conn->wait_for_activity(20s);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(text_of(*reply), "bye");
  try {
    while (seconds_since(start) < 20.0) {
      conn->wait_for_activity(20s);
      conn->poll();
    }
    ADD_FAILURE() << "the peer left, yet the connection did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_gone) << e.what();
  }
  EXPECT_LT(seconds_since(start), 10.0) << "the peer's disconnect did not wake the wait";
  ASSERT_TRUE(peer->wait_exit(10s).has_value());
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

TEST_F(PeerTest, MessageOfExactlyMaxMessageBytesArrives) {
  // The header promises "≤ max_message_bytes"; the 12-byte frame header must not count.
  start_peer(4096);
  const std::size_t max = conn->options().max_message_bytes;
  std::string message = "echo ";
  for (std::size_t i = message.size(); i < max; ++i) message += static_cast<char>('a' + i % 26);
  ASSERT_EQ(message.size(), max);
  EXPECT_EQ(command(message), message.substr(5)) << "the peer received the whole message";
  stop_peer();
}

TEST_F(PeerTest, FlushCompletesUnsignalledWrites) {
  // Five writes under automatic signalling (one in 32 is signalled): none of them is, so only
  // a flush that posts its own signalled marker can know when they are done.
  constexpr std::size_t kWrite = 4096, kWrites = 5;
  start_peer(kWrite * kWrites);
  Buffer src = Buffer::allocate(kWrite * kWrites);
  fill_pattern(src.bytes(), 606);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  const std::uint64_t signalled_before = conn->stats().signalled;
  for (std::size_t i = 0; i < kWrites; ++i) conn->write(mr, i * kWrite, peer_region, i * kWrite, kWrite);
  ASSERT_EQ(conn->stats().signalled, signalled_before) << "a write was signalled: the test proves nothing";
  conn->flush(30s);
  EXPECT_EQ(conn->outstanding(), 0u);
  EXPECT_EQ(command("verify 0 " + std::to_string(kWrite * kWrites) + " 606"), "ok");
  conn->flush(30s);  // nothing new posted: returns at once, posts nothing
  stop_peer();
}

TEST_F(PeerTest, RegionKeepsItsBuffersPagesAlive) {
  // Freeing a Buffer under a live registration must not unmap the pages the NIC may write:
  // the region pins them, and the peer's write lands in them byte for byte.
  constexpr std::size_t kBytes = 64 * 1024;
  start_peer(kBytes);
  std::optional<Buffer> buffer = Buffer::allocate(kBytes);
  std::optional<MemoryRegion> mr = MemoryRegion::register_buffer(*device, *buffer, Access::remote_write);
  std::byte* pages = mr->data();
  buffer.reset();
  // msync fails with ENOMEM on an unmapped range: a cheap, crash-free probe.
  ASSERT_EQ(::msync(pages, kBytes, MS_ASYNC), 0) << "the buffer's pages were unmapped under a live registration";
  conn->advertise(2, mr->descriptor());
  ASSERT_EQ(command("push 2 0 " + std::to_string(kBytes) + " 8080"), "ok");
  EXPECT_EQ(check_pattern({pages, kBytes}, 8080), std::nullopt);
  mr.reset();
  EXPECT_NE(::msync(pages, kBytes, MS_ASYNC), 0) << "the pages outlived their last user";
  stop_peer();
}

TEST_F(PeerTest, AWriteOrReadLongerThanThePortsLargestMessageGoesAsAChainByteForByte) {
  // 12.8 MB: a gradient over rxe's 8 MiB max_msg_sz. Each operation returns one op to wait for.
  const std::size_t size = 12'800'000;
  ASSERT_GT(size, device->info().max_message_bytes) << "the device carries it in one message: nothing to split";
  start_peer(size + 4096);
  Buffer src = Buffer::allocate(size);
  fill_pattern(src.bytes(), 9);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local_write);
  conn->wait(conn->write(mr, 0, peer_region, 3, size, Signal::always), 120s);
  EXPECT_EQ(command("verify 3 " + std::to_string(size) + " 9"), "ok");
  // The push: payload chain, then the doorbell at its end.
  conn->wait(conn->write_and_ring(mr, 0, peer_region, 0, size, 77), 120s);
  EXPECT_EQ(command("verify 0 " + std::to_string(size) + " 9"), "ok");
  // And back: a READ chain into a zeroed buffer.
  std::fill(src.bytes().begin(), src.bytes().end(), std::byte{0});
  conn->wait(conn->read(mr, 0, peer_region, 0, size), 120s);
  Buffer expected = Buffer::allocate(size);
  fill_pattern(expected.bytes(), 9);
  EXPECT_TRUE(std::equal(src.bytes().begin(), src.bytes().end(), expected.bytes().begin())) << "the READ chain";
  EXPECT_FALSE(conn->failed());
  stop_peer();
}

TEST_F(PeerTest, OversizedMessageIsRefusedLocally) {
  start_peer(4096);
  std::vector<std::byte> big(conn->options().max_message_bytes + 1, std::byte{1});
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
  // A size that ends mid-hugepage stays on 4 KiB pages (rxe refused such a hugepage mapping for
  // remote access: ibv_reg_mr EINVAL), and registers for remote writes, with hugepages free.
  Buffer odd = Buffer::allocate(4'019'200);
  EXPECT_FALSE(odd.on_hugepages());
  EXPECT_NO_THROW((void)MemoryRegion::register_buffer(*device, odd, Access::remote_write));
}

}  // namespace
}  // namespace gradlane::testing
