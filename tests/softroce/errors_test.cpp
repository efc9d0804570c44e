// Bad input over real rxe: every case gets a clear error within a bounded time, and the
// process survives.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../common/pattern.hpp"
#include "harness.hpp"

namespace gradlane::testing {
namespace {

using Clock = std::chrono::steady_clock;

TEST_F(PeerTest, WritePastTheRegionEndIsRefusedBeforePosting) {
  start_peer(4096);
  Buffer src = Buffer::allocate(8192);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  try {
    conn->write(mr, 0, peer_region, 4000, 200);
    FAIL() << "out-of-range write was posted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::out_of_range);
    EXPECT_NE(std::string(e.what()).find("RDMA WRITE"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing was sent"), std::string::npos) << e.what();
  }
  EXPECT_THROW(conn->read(mr, 8000, peer_region, 0, 500), Error) << "local slice past the end";
  // Offsets near 2^64 must not wrap around the bounds check.
  EXPECT_THROW(conn->write(mr, 0, peer_region, ~std::uint64_t{0} - 10, 100), Error);
  EXPECT_FALSE(conn->failed());
  // The connection is unharmed.
  fill_pattern({src.data(), 96}, 9);
  conn->wait(conn->write(mr, 0, peer_region, 4000, 96, Signal::always), 30s);
  EXPECT_EQ(command("verify 4000 96 9"), "ok");
  stop_peer();
}

TEST_F(PeerTest, WriteBeyondWhatThePeerRegisteredFailsTheConnectionAndTellsItsOwner) {
  start_peer(4096);
  Buffer src = Buffer::allocate(1u << 20);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  std::optional<Error> told;
  conn->on_failure([&](const Error& e) { told = e; });
  // A descriptor that claims more than the peer registered: only the peer's NIC can refuse.
  RegionDescriptor forged = peer_region;
  forged.length = 1u << 20;
  const auto start = Clock::now();
  try {
    conn->wait(conn->write(mr, 0, forged, 64 * 1024, 4096, Signal::always), 30s);
    FAIL() << "write outside the peer's region completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::remote_access) << e.what();
    EXPECT_NE(std::string(e.what()).find("RDMA WRITE of 4096 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("remote access error"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(start), 10.0);
  ASSERT_TRUE(told.has_value()) << "the failure handler was not called";
  EXPECT_EQ(told->code(), Errc::remote_access);
  EXPECT_TRUE(conn->failed());
  EXPECT_THROW(conn->poll(), Error) << "a failed connection keeps reporting its failure";
  conn.reset();  // disconnects; the peer sees its connection end and exits by itself
  const auto status = peer->wait_exit(20s);
  ASSERT_TRUE(status.has_value()) << "peer hung after the remote access error";
  EXPECT_TRUE(WIFEXITED(*status)) << "peer crashed: status " << *status;
}

TEST_F(PeerTest, WrongRkeyIsARemoteAccessError) {
  start_peer(4096);
  Buffer src = Buffer::allocate(4096);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  RegionDescriptor forged = peer_region;
  forged.rkey ^= 0x5a5a00;
  try {
    conn->wait(conn->write(mr, 0, forged, 0, 128, Signal::always), 30s);
    FAIL() << "write with a wrong rkey completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::remote_access) << e.what();
  }
  conn.reset();
  ASSERT_TRUE(peer->wait_exit(20s).has_value());
}

TEST(SoftRoceConnect, NoListenerIsAClearRejectionWithinTheTimeout) {
  const Device device = Device::open(selector_from_env());
  TransportOptions o = test_options();
  o.connect_timeout = 5s;
  const auto start = Clock::now();
  try {
    connect(device, softroce_env().address, 1, o);
    FAIL() << "connected to a port nobody listens on";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::connection_rejected) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing is listening"), std::string::npos) << e.what();
  }
  // The bound is the point (no 30 s hang), not its tightness: the connect timeout plus room
  // for a loaded 2-core machine.
  EXPECT_LT(seconds_since(start), 5.0 + 10.0);
  RecordProperty("no_listener_s", std::to_string(seconds_since(start)));
}

TEST(SoftRoceConnect, AddressWithNoHostFailsWithinTheTimeout) {
  const Device device = Device::open(selector_from_env());
  TransportOptions o = test_options();
  o.connect_timeout = 3s;
  const auto start = Clock::now();
  try {
    // In the device's subnet, but no host answers ARP for it.
    connect(device, "198.18.0.77", 7471, o);
    FAIL() << "connected to an address with no host";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == Errc::address_unresolved || e.code() == Errc::unreachable ||
                e.code() == Errc::route_unresolved)
        << errc_name(e.code()) << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("198.18.0.77"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(start), 3.0 + 10.0);  // the connect timeout, plus room for a loaded machine
}

TEST(SoftRoceConnect, MalformedAddressIsRejectedAtOnce) {
  const Device device = Device::open(selector_from_env());
  try {
    connect(device, "not an address!", 7471, test_options());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::address_unresolved);
    EXPECT_NE(std::string(e.what()).find("not an address!"), std::string::npos) << e.what();
  }
}

TEST(SoftRoceConnect, BusyPortSaysWhatIsWrongAndWhatToDo) {
  const Device device = Device::open(selector_from_env());
  Listener first(device, 0, test_options());
  try {
    Listener second(device, first.port(), test_options());
    FAIL() << "two listeners on port " << first.port();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), Errc::invalid_argument) << what;
    EXPECT_EQ(e.sys_errno(), EADDRINUSE) << what;
    EXPECT_NE(what.find("cannot listen on " + first.address() + ":" + std::to_string(first.port())), std::string::npos)
        << what;
    EXPECT_NE(what.find("Address already in use"), std::string::npos) << what;
    EXPECT_NE(what.find("choose another port"), std::string::npos) << what;
    EXPECT_EQ(what.find("failed: Address"), std::string::npos) << "garbled: " << what;
  }
}

// Reads the half-open peer's stdout until it says its connect request is out.
bool wait_for_line(const std::string& path, const std::string& line, std::chrono::seconds limit) {
  const auto give_up = Clock::now() + limit;
  while (Clock::now() < give_up) {
    std::ifstream in(path);
    std::string got;
    while (std::getline(in, got)) {
      if (got == line) return true;
    }
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

TEST(SoftRoceConnect, HalfOpenPeerCostsOnlyItselfAndAcceptKeepsItsOwnTimeout) {
  // A peer that sends a connect request and never completes the handshake must neither make
  // accept() outlive the caller's timeout (connect_timeout here is 20 s) nor fail it for the
  // peers that do complete theirs.
  const Device device = Device::open(selector_from_env());
  Listener listener(device, 0, test_options());
  const std::string prefix = std::string(std::getenv("GRADLANE_OUT_DIR")) + "/half-open";
  PeerProcess half_open({"half-open", listener.address(), std::to_string(listener.port())}, prefix);
  ASSERT_TRUE(wait_for_line(prefix + ".out", "requested", 30s)) << "the half-open peer never sent its request";
  const auto start = Clock::now();
  try {
    listener.accept(1s);
    FAIL() << "accepted a peer whose handshake never completes";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout) << e.what();
  }
  const double waited = seconds_since(start);
  EXPECT_LT(waited, 10.0) << "accept(1 s) waited for the half-open peer's handshake (connect_timeout 20 s)";
  RecordProperty("accept_1s_with_half_open_peer_s", std::to_string(waited));
  // A well-behaved peer arriving after it is accepted, and works.
  PeerProcess good({listener.address(), std::to_string(listener.port()), "4096"});
  Connection conn = listener.accept(30s);
  EXPECT_EQ(conn.wait_region(1, 30s).length, 4096u);
  send_text(conn, "echo still here");
  EXPECT_EQ(text_of(conn.receive(30s)), "still here");
  send_text(conn, "exit");
  EXPECT_EQ(text_of(conn.receive(30s)), "bye");
  ASSERT_TRUE(good.wait_exit(10s).has_value());
}

TEST(SoftRoceConnect, PastItsPendingHandshakesAListenerRefusesPeersAsBusyUntilOneEnds) {
  // Each answered connect request holds a QP and registered rings until its handshake
  // completes: with max_pending_accepts 1, a half-open peer's request fills the listener, the
  // next peer is refused and told it is busy (no QP for it), and once the half-open one has
  // outlived connect_timeout a peer is accepted again.
  const Device device = Device::open(selector_from_env());
  TransportOptions options = test_options();
  options.max_pending_accepts = 1;
  options.connect_timeout = 3s;
  Listener listener(device, 0, options);
  const std::string prefix = std::string(std::getenv("GRADLANE_OUT_DIR")) + "/busy-half-open";
  PeerProcess half_open({"half-open", listener.address(), std::to_string(listener.port())}, prefix);
  ASSERT_TRUE(wait_for_line(prefix + ".out", "requested", 30s)) << "the half-open peer never sent its request";
  EXPECT_THROW(listener.accept(500ms), Error) << "the half-open peer's handshake completed";  // answers it
  std::optional<Error> refused;
  {
    std::jthread second([&] {
      try {
        const Device own = Device::open(selector_from_env());
        Connection conn = connect(own, listener.address(), listener.port(), test_options());
      } catch (const Error& e) {
        refused = e;
      }
    });
    try {
      Connection conn = listener.accept(2s);
      ADD_FAILURE() << "accepted a peer past max_pending_accepts";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::timeout) << e.what();
    }
  }
  ASSERT_TRUE(refused.has_value()) << "the second peer was connected";
  EXPECT_EQ(refused->code(), Errc::connection_rejected) << refused->what();
  EXPECT_NE(std::string(refused->what()).find("busy"), std::string::npos) << refused->what();
  std::this_thread::sleep_for(1s);  // the half-open request is now past its 3 s
  PeerProcess good({listener.address(), std::to_string(listener.port()), "4096"});
  Connection conn = listener.accept(30s);
  EXPECT_EQ(conn.wait_region(1, 30s).length, 4096u);
  send_text(conn, "exit");
  EXPECT_EQ(text_of(conn.receive(30s)), "bye");
  ASSERT_TRUE(good.wait_exit(10s).has_value());
}

TEST(SoftRoceConnect, OnlyAPeerWithTheListenersJobKeyGetsAConnection) {
  // Isolation between jobs at the door: a listener keyed for job A refuses a connect request
  // carrying another key or none — no QP, nothing accepted — and the refused side is told it
  // was the key; a peer with A's key is accepted and works. A keyed connector also refuses a
  // listener that answers with another key, before sending anything.
  const Device device = Device::open(selector_from_env());
  TransportOptions job_a = test_options();
  job_a.job_key = "job-a:7c41d09e";
  Listener listener(device, 0, job_a);
  const auto attempt = [&](const std::string& key) -> std::optional<Error> {
    TransportOptions o = test_options();
    o.job_key = key;
    try {
      const Device own = Device::open(selector_from_env());
      Connection conn = connect(own, listener.address(), listener.port(), o);
      return std::nullopt;
    } catch (const Error& e) {
      return e;
    }
  };
  for (const std::string key : {"job-b:7c41d09e", "", "job-a:7c41d09f"}) {
    std::optional<Error> refused;
    const auto start = Clock::now();
    {
      std::jthread rogue([&] { refused = attempt(key); });
      try {
        Connection conn = listener.accept(2s);
        ADD_FAILURE() << "accepted a peer with key '" << key << "'";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::timeout) << e.what();
      }
    }
    ASSERT_TRUE(refused.has_value()) << "a peer with key '" << key << "' was connected";
    EXPECT_EQ(refused->code(), Errc::connection_rejected) << refused->what();
    EXPECT_NE(std::string(refused->what()).find("job key"), std::string::npos) << refused->what();
    RecordProperty("refused_in_s", std::to_string(seconds_since(start)));
  }
  {
    std::optional<Error> failed{Error(Errc::timeout, "did not run")};
    std::jthread member([&] {
      failed = std::nullopt;
      TransportOptions o = test_options();
      o.job_key = job_a.job_key;
      try {
        const Device own = Device::open(selector_from_env());
        Connection conn = connect(own, listener.address(), listener.port(), o);
        send_text(conn, "member");
        (void)conn.receive(30s);
      } catch (const Error& e) {
        failed = e;
      }
    });
    Connection conn = listener.accept(30s);
    EXPECT_EQ(text_of(conn.receive(30s)), "member");
    send_text(conn, "welcome");
    member.join();
    EXPECT_FALSE(failed.has_value()) << failed->what();
  }
  // A keyed connector and a listener without a key: refused as well (by the listener, which
  // sees the key first; the connector's own check of the answer's key passed above for the
  // member, whose connection works only if the answer carried A's key).
  Listener keyless(device, 0, test_options());
  std::optional<Error> refused;
  {
    std::jthread member([&] {
      TransportOptions o = test_options();
      o.job_key = job_a.job_key;
      try {
        const Device own = Device::open(selector_from_env());
        Connection conn = connect(own, keyless.address(), keyless.port(), o);
      } catch (const Error& e) {
        refused = e;
      }
    });
    try {
      Connection conn = keyless.accept(3s);
    } catch (const Error&) {
    }
  }
  ASSERT_TRUE(refused.has_value()) << "a keyed connector used a listener without the key";
  EXPECT_EQ(refused->code(), Errc::connection_rejected) << refused->what();
  EXPECT_NE(std::string(refused->what()).find("job key"), std::string::npos) << refused->what();
}

TEST(SoftRoceConnect, PeerWhoseHandshakeCompletedIsAcceptedThoughTheCallerReadsItLate) {
  // A server answering a burst of connect requests (the 32-worker load test), or busy between
  // accepts, can read the channel after a peer's handshake completed but after its
  // connect_timeout; accept() must not drop that established peer as "did not complete the
  // handshake" before reading the ESTABLISHED event waiting for it. Two peers connect while
  // nobody accepts; the first accept() answers both and returns one; the test then stays
  // away longer than the listener's connect_timeout (1 s) — the second must still be accepted.
  const Device device = Device::open(selector_from_env());
  TransportOptions listener_options = test_options();
  listener_options.connect_timeout = 1s;
  Listener listener(device, 0, listener_options);
  std::atomic<bool> done{false};
  std::atomic<int> connected{0};
  std::vector<std::jthread> peers;
  for (int i = 0; i < 2; ++i) {
    peers.emplace_back([&] {
      try {
        const Device own = Device::open(selector_from_env());
        Connection conn = connect(own, listener.address(), listener.port(), test_options());  // 20 s
        ++connected;
        while (!done.load()) std::this_thread::sleep_for(10ms);
      } catch (const Error& e) {
        std::fprintf(stderr, "peer: %s\n", e.what());
      }
    });
  }
  std::this_thread::sleep_for(3s);  // both connect requests are queued at the listener
  Connection first = listener.accept(30s);
  std::this_thread::sleep_for(2500ms);  // the other's ESTABLISHED arrives, unread, meanwhile
  try {
    Connection second = listener.accept(5s);
    EXPECT_FALSE(second.failed());
  } catch (const Error& e) {
    ADD_FAILURE() << "the second peer completed its handshake but was not accepted: " << e.what();
  }
  EXPECT_FALSE(first.failed());
  done.store(true);
  peers.clear();
  EXPECT_EQ(connected.load(), 2);
}

TEST(SoftRoceConnect, BothSidesAskASenderTheyRefuseForWantOfAReceiveToRetryWithinAMillisecond) {
  // rdma_cm leaves the queue pair's RNR timer at code 0, 655 ms: a sender that outruns our
  // receives (a shared receive queue run dry) waited that long per refusal, and on a loaded CI
  // machine rxe failed such a sender with "transport retry counter exceeded". Both the
  // accepting and the connecting side must hold 0.64 ms, read back from the queue pair.
  const Device device = Device::open(selector_from_env());
  Listener listener(device, 0, test_options());
  std::optional<std::chrono::microseconds> connecting_side;
  std::atomic<bool> done{false};
  std::jthread peer([&] {
    try {
      const Device own = Device::open(selector_from_env());
      Connection conn = connect(own, listener.address(), listener.port(), test_options());
      connecting_side = conn.receiver_not_ready_delay();
      while (!done.load()) std::this_thread::sleep_for(10ms);
    } catch (const Error& e) {
      std::fprintf(stderr, "peer: %s\n", e.what());
    }
  });
  std::optional<Connection> accepted;
  try {
    accepted.emplace(listener.accept(30s));
  } catch (const Error& e) {
    ADD_FAILURE() << "no connection: " << e.what();
  }
  if (accepted) {
    EXPECT_EQ(accepted->receiver_not_ready_delay(), 640us);
  }
  done.store(true);  // whatever happened above: the peer thread must end for join()
  peer.join();
  ASSERT_TRUE(connecting_side.has_value()) << "the connecting side did not connect";
  EXPECT_EQ(*connecting_side, 640us);
}

TEST(SoftRoceConnect, ARequestWhosePeerGaveUpIsDroppedSayingSo) {
  // Seen in the 32-worker load test: workers whose connect timed out before the busy server
  // answered left stale requests behind, and the server's drop message for each blamed the
  // queue depths ("lower GRADLANE_SQ_DEPTH ...": rdma_create_qp / rdma_accept fail with EINVAL
  // once the peer abandoned the request). The drop must say what happened.
  const Device device = Device::open(selector_from_env());
  Listener listener(device, 0, test_options());
  std::jthread peer([&] {
    TransportOptions impatient = test_options();
    impatient.connect_timeout = 1s;
    try {
      const Device own = Device::open(selector_from_env());
      Connection conn = connect(own, listener.address(), listener.port(), impatient);
      std::fprintf(stderr, "peer: connected, unexpectedly\n");
    } catch (const Error& e) {
      std::fprintf(stderr, "peer gave up: %s\n", e.what());
    }
  });
  std::this_thread::sleep_for(4s);  // the peer's 1 s connect timeout passes unanswered
  peer.join();
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(listener.accept(2s), Error);
  const std::string said = ::testing::internal::GetCapturedStderr();
  std::fprintf(stderr, "%s", said.c_str());
  EXPECT_NE(said.find("dropped connection attempt"), std::string::npos) << "the stale request was not even seen";
  EXPECT_EQ(said.find("GRADLANE_SQ_DEPTH"), std::string::npos) << "blames the queue depths";
  EXPECT_NE(said.find("gave up"), std::string::npos);
}

TEST(SoftRoceConnect, AcceptWithNoPeerTimesOut) {
  const Device device = Device::open(selector_from_env());
  Listener listener(device, 0, test_options());
  const auto start = Clock::now();
  try {
    listener.accept(500ms);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  EXPECT_LT(seconds_since(start), 10.0);  // 0.5 s asked; a loaded machine may add a few seconds
}

TEST_F(PeerTest, PeerKilledMidTransferIsAnErrorWithinAboutTwoSeconds) {
  constexpr std::size_t kChunk = 64 * 1024;
  start_peer(kChunk * 16);
  Buffer src = Buffer::allocate(kChunk);
  MemoryRegion mr = MemoryRegion::register_buffer(*device, src, Access::local);
  std::optional<Error> told;
  conn->on_failure([&](const Error& e) { told = e; });
  for (int i = 0; i < 64; ++i) conn->write(mr, 0, peer_region, (i % 16) * kChunk, kChunk);
  peer->kill_hard();
  const auto killed = Clock::now();
  double detected = -1;
  try {
    // Keep streaming as a trainer would; the failure must surface, not hang.
    for (int i = 0; seconds_since(killed) < 15.0; ++i) {
      conn->write(mr, 0, peer_region, (i % 16) * kChunk, kChunk);
      conn->poll();
    }
  } catch (const Error& e) {
    detected = seconds_since(killed);
    EXPECT_EQ(e.code(), Errc::peer_gone) << e.what();
  }
  ASSERT_GE(detected, 0.0) << "no error 15 s after the peer was killed";
  // Measured and reported (typically well under 3 s); asserted only against a hang, since a
  // loaded 2-core machine can delay the kernel's disconnect by seconds.
  RecordProperty("dead_peer_detection_s", std::to_string(detected));
  std::printf("dead peer detected after %.2f s\n", detected);
  ASSERT_TRUE(told.has_value());
  const auto status = peer->wait_exit(5s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
}

TEST_F(PeerTest, PeerThatExitsIsSeenAsGone) {
  start_peer(4096);
  stop_peer();
  const auto start = Clock::now();
  try {
    while (seconds_since(start) < 10.0) conn->poll();
    FAIL() << "no error after the peer exited";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_gone) << e.what();
    EXPECT_NE(std::string(e.what()).find("disconnected"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(start), 10.0);  // seen at once on an idle machine; room for a loaded one
  EXPECT_THROW(send_text(*conn, "x"), Error);
}

TEST_F(PeerTest, APeersLastMessageBeforeItExitsIsDelivered) {
  // The peer answers "bye" and exits at once. Its disconnect could be seen before the reply's
  // completion was reaped, and the reply was lost to a "disconnected" error — about one
  // stop_peer() in twenty under load. Now what arrived before the disconnect is delivered
  // first, then the connection fails.
  for (int round = 0; round < 12; ++round) {
    start_peer(4096);
    send_text(*conn, "exit");
    EXPECT_EQ(text_of(conn->receive(10s)), "bye") << "round " << round;
    EXPECT_THROW(conn->receive(10s), Error) << "round " << round;
    ASSERT_TRUE(peer->wait_exit(10s).has_value());
    conn.reset();
  }
}

TEST(SoftRoceMemory, MemlockTooLowGivesTheActionableMessage) {
  // In a separate process: it gives up CAP_IPC_LOCK and lowers its own limit.
  PeerProcess child({"memlock"});
  const auto status = child.wait_exit(60s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "status " << *status;
}

TEST_F(PeerTest, RegistrationCacheMustBeInvalidatedWhenMemoryIsReplaced) {
  // The ps-lite failure: a buffer is freed and another one appears at the same address. An
  // MR pins the *old* pages, so a cached registration that is not invalidated sends the
  // peer's writes to memory the program no longer sees.
  constexpr std::size_t kBytes = 64 * 1024;
  start_peer(kBytes);
  RegistrationCache cache(*device);
  auto map = [](void* hint) {
    void* p = ::mmap(hint, kBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | (hint ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    return static_cast<std::byte*>(p);
  };
  std::byte* first = map(nullptr);
  const MemoryRegion& mr1 = cache.get(first, kBytes, Access::remote_write);
  conn->advertise(2, mr1.descriptor());
  ASSERT_EQ(command("push 2 0 65536 1"), "ok");
  EXPECT_EQ(check_pattern({first, kBytes}, 1), std::nullopt);

  // Replace the memory without telling the cache: it still hands out the stale MR...
  ASSERT_EQ(::munmap(first, kBytes), 0);
  std::byte* second = map(first);
  ASSERT_EQ(second, first);
  const MemoryRegion& stale = cache.get(second, kBytes, Access::remote_write);
  EXPECT_EQ(&stale, &mr1);
  EXPECT_EQ(cache.stats().hits, 1u);
  conn->advertise(3, stale.descriptor());
  ASSERT_EQ(command("push 3 0 65536 2"), "ok");
  // ...and the write lands in the old pinned pages, not in the memory now at that address.
  EXPECT_NE(check_pattern({second, kBytes}, 2), std::nullopt);
  EXPECT_EQ(second[0], std::byte{0});

  // With invalidation the next get() registers the new pages and the data arrives.
  EXPECT_EQ(cache.invalidate(second, kBytes), 1u);
  const MemoryRegion& fresh = cache.get(second, kBytes, Access::remote_write);
  EXPECT_EQ(cache.stats().misses, 2u);
  conn->advertise(4, fresh.descriptor());
  ASSERT_EQ(command("push 4 0 65536 3"), "ok");
  EXPECT_EQ(check_pattern({second, kBytes}, 3), std::nullopt);
  stop_peer();
  cache.clear();
  ::munmap(second, kBytes);
}

}  // namespace
}  // namespace gradlane::testing
