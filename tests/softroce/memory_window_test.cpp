// Memory windows over real rxe: a writer reaches exactly the slot a window grants it.
//
// This process is the victim server: it owns a ring of slots, each registered as a region of
// its own with Access::windows and no remote rights (rxe bounds a window access only by the
// region under it: see DeviceInfo::window_bounds_checked), and binds a type-2 window per grant
// on the connection of the peer it grants. The peer process is the (possibly rogue) writer:
// `write K ADDR RKEY LEN SEED` writes over its K-th connection to a raw (address, key) and
// reports "ok" or how it was refused. A refused write fails that one connection; the peer
// keeps its control connection (0) to report. After every case the whole ring is compared
// byte for byte with what it must hold.
#include <chrono>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "../common/pattern.hpp"
#include "harness.hpp"

namespace gradlane::testing {
namespace {

constexpr std::size_t kSlot = 4096, kSlots = 4;
constexpr std::uint64_t kBackground = 999;  // the ring's initial contents: pattern seed 999

class MemoryWindowTest : public PeerTest {
 protected:
  void SetUp() override {
    PeerTest::SetUp();
    ring_memory.emplace(Buffer::allocate(kSlot * kSlots, Buffer::Pages::small_only));
    fill_pattern(ring_memory->bytes(), kBackground);
    expected.assign(ring_memory->data(), ring_memory->data() + ring_memory->size());
    for (std::size_t i = 0; i < kSlots; ++i) {
      slots.push_back(
          MemoryRegion::register_slice(*device, *ring_memory, i * kSlot, kSlot, Access::local_write | Access::windows));
    }
    start_peer(2 * kSlot);
  }

  // A new connection from the peer (its connection number `peer_index`), accepted here.
  Connection another_connection() {
    send_text(*conn, "connect_again");
    Connection data = listener->accept(30s);
    data.wait_region(1, 30s);  // the peer advertises its own region on every connection
    EXPECT_EQ(text_of(conn->receive(30s)), "ok");
    ++peer_connections;
    return data;
  }

  // A new connection from the peer and a window to grant it (the window goes first).
  struct Grantee {
    Connection data;
    MemoryWindow window;
  };
  Grantee grantee() { return {another_connection(), MemoryWindow::allocate(*device)}; }

  // Binds `window` over slot `slot` on `data` and waits until the bind executed: the peer is
  // told the key over another connection, which RC does not order after the bind.
  RegionDescriptor grant(Connection& data, MemoryWindow& window, std::size_t slot) {
    data.wait(data.bind_window(window, slots[slot], 0, kSlot, Access::remote_write), 10s);
    const RegionDescriptor d = window.descriptor();
    EXPECT_EQ(d.addr, address_of(slot));
    EXPECT_EQ(d.length, kSlot);
    return d;
  }

  std::uint64_t address_of(std::size_t slot) const {
    return reinterpret_cast<std::uintptr_t>(ring_memory->data()) + slot * kSlot;
  }

  // The peer writes `length` bytes of pattern `seed` to (addr, rkey) over its connection `k`.
  std::string peer_write(std::size_t k, std::uint64_t addr, std::uint32_t rkey, std::size_t length,
                         std::uint64_t seed) {
    return command("write " + std::to_string(k) + " " + std::to_string(addr) + " " + std::to_string(rkey) + " " +
                   std::to_string(length) + " " + std::to_string(seed));
  }

  // Records that [offset, offset+length) of the ring now holds pattern `seed`.
  void expect_written(std::size_t offset, std::size_t length, std::uint64_t seed) {
    fill_pattern({expected.data() + offset, length}, seed);
  }

  // Every byte of the ring is what the accepted writes and the background make it.
  void verify_ring() {
    ASSERT_EQ(std::memcmp(ring_memory->data(), expected.data(), expected.size()), 0)
        << "ring differs from expected at byte " << first_difference();
  }
  std::size_t first_difference() const {
    for (std::size_t i = 0; i < expected.size(); ++i) {
      if (ring_memory->data()[i] != expected[i]) return i;
    }
    return expected.size();
  }

  // The peer writes `length` bytes through `slot` (its start) over its connection `k`; they
  // land at `ring_offset` and the whole ring is checked.
  void expect_lands(std::size_t k, const RegionDescriptor& slot, std::size_t length, std::uint64_t seed,
                    std::size_t ring_offset) {
    EXPECT_EQ(peer_write(k, slot.addr, slot.rkey, length, seed), "ok");
    expect_written(ring_offset, length, seed);
    verify_ring();
  }
  // The peer's write to (addr, rkey) is refused and the ring is untouched.
  void expect_refused_write(std::size_t k, std::uint64_t addr, std::uint32_t rkey, std::size_t length,
                            std::uint64_t seed) {
    expect_refused(peer_write(k, addr, rkey, length, seed));
    verify_ring();
  }

  // The server still serves this peer's control connection after a refusal.
  void expect_control_alive() { EXPECT_EQ(command("echo still here"), "still here"); }

  static void expect_refused(const std::string& reply) {
    EXPECT_EQ(reply.rfind("refused remote_access: ", 0), 0u) << reply;
    EXPECT_NE(reply.find("remote access error (status 10"), std::string::npos) << reply;  // IBV_WC_REM_ACCESS_ERR
    std::printf("  [measured] %s\n", reply.c_str());
  }

  std::optional<Buffer> ring_memory;
  std::vector<MemoryRegion> slots;
  std::vector<std::byte> expected;
  std::size_t peer_connections = 1;  // the peer's connection 0 is `conn`
};

TEST_F(MemoryWindowTest, DeviceHasTypeTwoWindows) {
  const DeviceInfo& info = device->info();
  std::printf("  [measured] %s: memory_windows (type 2A/2B) %s, max_mw %u, vendor_id %#x\n", info.name.c_str(),
              info.memory_windows ? "yes" : "no", info.max_memory_windows, info.vendor_id);
  EXPECT_TRUE(info.memory_windows) << "rdma_rxe advertises MEM_WINDOW_TYPE_2B";
  EXPECT_GT(info.max_memory_windows, 0u);
  EXPECT_EQ(info.vendor_id, 0xffffffu) << "the suite runs over rdma_rxe";
  EXPECT_FALSE(info.window_bounds_checked) << "rxe bounds a window access by its region only";
  stop_peer();
}

TEST_F(MemoryWindowTest, WriteInsideTheWindowLands) {
  auto [data, window] = grantee();
  const RegionDescriptor slot = grant(data, window, 1);
  EXPECT_NE(slot.rkey, slots[1].rkey());
  expect_lands(1, slot, kSlot, 11, kSlot);
  stop_peer();
}

TEST_F(MemoryWindowTest, WriteBeyondTheSlotIsRefusedAndTouchesNothing) {
  // The slot's window, then 100 bytes past its end — into the next slot of the same buffer.
  auto [data, window] = grantee();
  const RegionDescriptor slot = grant(data, window, 1);
  expect_refused_write(1, slot.addr + kSlot - 100, slot.rkey, 200, 12);
  expect_control_alive();
  // Measured, not asserted: what the refusal did to this side of the writer's connection.
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (!data.failed() && std::chrono::steady_clock::now() < deadline) {
    try {
      data.poll();
    } catch (const Error&) {
    }
  }
  std::printf("  [measured] server side of the refused connection after 2 s: %s\n",
              data.failed() ? data.failure()->what() : "not failed");

  // The server keeps serving its other connections: a second writer's grant still lands.
  Connection second = another_connection();
  MemoryWindow other = MemoryWindow::allocate(*device);
  const RegionDescriptor next = grant(second, other, 2);
  expect_lands(2, next, kSlot, 13, 2 * kSlot);
  stop_peer();
}

TEST_F(MemoryWindowTest, WriteToAnotherSlotWithTheWindowKeyIsRefused) {
  auto [data, window] = grantee();
  const RegionDescriptor slot = grant(data, window, 1);
  expect_refused_write(1, address_of(0), slot.rkey, 64, 14);  // slot 0, wholly outside
  expect_control_alive();
  stop_peer();
}

TEST_F(MemoryWindowTest, GuessedKeysAreRefused) {
  // Each guess comes from the very connection the window is bound on, right after the grant,
  // so only the key is wrong: the window's neighbouring 8-bit keys, the slot region's own keys
  // (they never leave this process; the region has no remote rights anyway), an unrelated key.
  std::vector<Connection> rogues;  // declared before the window: it goes first
  MemoryWindow window = MemoryWindow::allocate(*device);
  std::printf("  [measured] slot region rkey %#x lkey %#x\n", slots[1].rkey(), slots[1].lkey());
  for (int guess = 0; guess < 5; ++guess) {
    rogues.push_back(another_connection());
    const RegionDescriptor slot = grant(rogues.back(), window, 1);
    const std::uint32_t keys[] = {slot.rkey + 1, slot.rkey - 1, slots[1].rkey(), slots[1].lkey(), 0x12345678u};
    expect_refused_write(peer_connections - 1, slot.addr, keys[guess], 64, 20 + guess);
  }
  expect_control_alive();
  stop_peer();
}

TEST_F(MemoryWindowTest, RebindMovesTheGrantAndTheOldKeyDies) {
  auto [data, window] = grantee();
  const RegionDescriptor first = grant(data, window, 0);
  expect_lands(1, first, kSlot, 40, 0);
  const RegionDescriptor second = grant(data, window, 1);  // LOCAL_INV + BIND_MW in one post, next region
  EXPECT_NE(second.rkey, first.rkey);
  EXPECT_EQ(second.rkey >> 8, first.rkey >> 8) << "same window, next 8-bit key";
  expect_lands(1, second, kSlot, 41, kSlot);
  expect_refused_write(1, first.addr, first.rkey, kSlot, 42);  // the old grant's key
  expect_control_alive();
  stop_peer();
}

TEST_F(MemoryWindowTest, InvalidatedKeyIsRefused) {
  auto [data, window] = grantee();
  const RegionDescriptor slot = grant(data, window, 3);
  expect_lands(1, slot, 512, 50, 3 * kSlot);
  data.wait(data.invalidate_window(window), 10s);
  EXPECT_FALSE(window.bound());
  expect_refused_write(1, slot.addr, slot.rkey, 512, 51);
  expect_control_alive();
  stop_peer();
}

TEST_F(MemoryWindowTest, WindowKeyFromAnotherQueuePairIsRefused) {
  // Type 2: the window admits only the QP it was bound on. The same peer's other connection,
  // holding the right key and address, is refused; the bound one still writes afterwards.
  Connection bound_conn = another_connection();
  Connection other_conn = another_connection();
  MemoryWindow window = MemoryWindow::allocate(*device);
  const RegionDescriptor slot = grant(bound_conn, window, 2);
  expect_refused_write(2, slot.addr, slot.rkey, kSlot, 60);
  expect_lands(1, slot, kSlot, 61, 2 * kSlot);
  stop_peer();
}

TEST_F(MemoryWindowTest, MisuseIsRefusedBeforePosting) {
  auto [data, window] = grantee();
  EXPECT_THROW(window.descriptor(), Error);  // not bound yet
  Buffer plain_memory = Buffer::allocate(kSlot);
  MemoryRegion plain = MemoryRegion::register_buffer(*device, plain_memory, Access::remote_write);
  const auto code_of = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return e.code();
    }
    return Errc::system;  // "no error" shows up as a mismatch below
  };
  EXPECT_EQ(code_of([&] { data.bind_window(window, plain, 0, kSlot, Access::remote_write); }), Errc::invalid_argument);
  EXPECT_EQ(code_of([&] { data.bind_window(window, slots[0], kSlot - 8, 16, Access::remote_write); }),
            Errc::out_of_range);
  EXPECT_EQ(code_of([&] { data.bind_window(window, slots[0], 0, kSlot, Access::local_write); }),
            Errc::invalid_argument);
  // rxe would let a window over half a slot reach the whole slot: refused, not half-enforced.
  EXPECT_EQ(code_of([&] { data.bind_window(window, slots[0], 0, kSlot / 2, Access::remote_write); }),
            Errc::unsupported);
  EXPECT_EQ(code_of([&] { data.invalidate_window(window); }), Errc::invalid_argument);
  EXPECT_FALSE(data.failed());
  // Nothing was posted, so the connection is intact: a real grant still works.
  const RegionDescriptor slot = grant(data, window, 0);
  expect_lands(1, slot, 128, 70, 0);
  stop_peer();
}

TEST_F(MemoryWindowTest, AWindowKeepsItsRegionRegistered) {
  // The slot's MemoryRegion is dropped while a window is bound over it: the window keeps the
  // registration (verbs would refuse to deregister it) and the pages, so the grant still works.
  auto [data, window] = grantee();
  const RegionDescriptor slot = grant(data, window, 2);
  slots[2] =
      MemoryRegion::register_slice(*device, *ring_memory, 3 * kSlot, kSlot, Access::local_write | Access::windows);
  expect_lands(1, slot, kSlot, 80, 2 * kSlot);
  stop_peer();
}

TEST_F(MemoryWindowTest, ClosingTheConnectionRevokesItsWindows) {
  // The connection goes while a window is still bound on its QP (the window outlives it). rxe's
  // QP teardown waits for the window's hold on the QP — 52 s measured before the connection
  // revoked its windows — so closing must revoke them first: fast, the old key dead, and the
  // window usable again through a fresh bind.
  MemoryWindow window = MemoryWindow::allocate(*device);
  std::optional<Connection> first(another_connection());
  const RegionDescriptor old_slot = grant(*first, window, 0);
  const auto start = std::chrono::steady_clock::now();
  first.reset();
  const auto took = std::chrono::steady_clock::now() - start;
  std::printf("  [measured] closing a connection with a bound window took %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  EXPECT_LT(took, 5s);
  EXPECT_FALSE(window.bound());
  Connection second = another_connection();
  grant(second, window, 1);
  expect_refused_write(2, old_slot.addr, old_slot.rkey, 64, 90);  // the revoked key, from a live QP
  Connection third = another_connection();
  const RegionDescriptor again = grant(third, window, 1);
  expect_lands(3, again, kSlot, 91, kSlot);
  stop_peer();
}

}  // namespace
}  // namespace gradlane::testing
