// Grant tokens (include/gradlane/sidecar.hpp): the function itself, and the daemon stamping a
// keyed receiver's grants with them — and only those of a receiver whose server gave a key.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>

#include "harness.hpp"

namespace gradlane::sidecar::test {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kReceiver = 9;  // small_update()'s receiver

GrantKey counting_key() {
  GrantKey key{};
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::uint8_t>(i);
  return key;
}

TEST(GrantToken, IsSipHash24OfTheSequenceInLittleEndian) {
  // The SipHash paper's test vector for the 8-byte message 00 01 … 07 under key 00 01 … 0f:
  // 62 24 93 9a 79 f5 f5 93 (little-endian). Another host's gradlaned and the server compute
  // the same token only if both read the sequence and the result in the same byte order.
  EXPECT_EQ(grant_token(counting_key(), 0x0706050403020100ULL), 0x93f5f5799a932462ULL);
}

TEST(GrantToken, DiffersWithTheSequenceAndTheKeyAndIsNeverZero) {
  const GrantKey key = random_grant_key(), other = random_grant_key();
  EXPECT_NE(key, other) << "two keys from the kernel's random source";
  EXPECT_NE(key, GrantKey{});
  std::set<std::uint64_t> seen;
  for (std::uint64_t sequence = 1; sequence <= 1000; ++sequence) {
    const std::uint64_t token = grant_token(key, sequence);
    EXPECT_NE(token, 0U);
    EXPECT_EQ(token, grant_token(key, sequence)) << "not a function of key and sequence";
    EXPECT_NE(token, grant_token(other, sequence)) << "sequence " << sequence;
    seen.insert(token);
  }
  EXPECT_EQ(seen.size(), 1000U) << "two sequences share a token";
}

AttachOptions server_of_receiver(const std::string& name, std::optional<GrantKey> key) {
  AttachOptions o = test_attach(name, 1);
  o.endpoint = kReceiver;
  o.slots = 4;
  o.grant_key = key;
  return o;
}

TEST(GrantToken, TheDaemonStampsAKeyedReceiversGrantsWithTheirSequencesTokens) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(no_replica()));
  const GrantKey key = random_grant_key();
  Client server = Client::attach(server_of_receiver(name, key));
  Client worker = Client::attach(test_attach(name, 1));
  for (int i = 0; i < 3; ++i) worker.request(small_update());
  for (int i = 0; i < 3; ++i) {
    const Grant g = worker.wait(2s);
    ASSERT_EQ(g.kind, GrantKind::go);
    EXPECT_EQ(g.token, grant_token(key, g.sequence)) << "sequence " << g.sequence;
    worker.complete(g.request, g.part_index, 1us);
  }
  // The server app gone, the receiver's sequence goes on, and its tokens with it: a grant
  // without one could not be written at a windowed server (its replica, promoted, answers a
  // claim of a sequence below its takeover with "decided").
  server.detach();
  worker.request(small_update());
  const Grant after = worker.wait(2s);
  ASSERT_EQ(after.kind, GrantKind::go);
  EXPECT_EQ(after.token, grant_token(key, after.sequence)) << "a grant after the server app left";
  worker.complete(after.request, after.part_index, 1us);
  // A server app without a key: its grants carry none.
  Client plain = Client::attach(server_of_receiver(name, std::nullopt));
  plain.applied(4);  // its 4 slots are free again
  worker.request(small_update());
  const Grant g = worker.wait(2s);
  ASSERT_EQ(g.kind, GrantKind::go);
  EXPECT_EQ(g.token, 0U);
}

TEST(GrantToken, AReplicaThatTakesTheSequenceOverHasItsGrantsStampedWithItsKey) {
  // A promoted replica attaches taking its receiver's sequence over, with its server's key:
  // the grants this daemon hands out from then on carry tokens of that key.
  const std::string name = unique_shm_name();
  DaemonConfig config = test_config(name);
  config.standby = {{kReceiver, 1}};
  DaemonDriver driver(config, std::make_unique<sched::SchedulerPolicy>(no_replica()));
  const GrantKey key = random_grant_key();
  AttachOptions promoted = server_of_receiver(name, key);
  promoted.take_over_at = 40;
  Client server = Client::attach(promoted);
  Client worker = Client::attach(test_attach(name, 1));
  worker.request(small_update());
  const Grant g = worker.wait(2s);
  ASSERT_EQ(g.kind, GrantKind::go);
  EXPECT_EQ(g.sequence, 41u);
  EXPECT_EQ(g.token, grant_token(key, g.sequence));
}

TEST(GrantToken, OnlyAServerAppMayGiveAKey) {
  const std::string name = unique_shm_name();
  DaemonDriver driver(test_config(name), std::make_unique<sched::SchedulerPolicy>(no_replica()));
  AttachOptions worker = test_attach(name, 1);
  worker.grant_key = random_grant_key();
  try {
    Client::attach(worker);
    FAIL() << "a worker attached with a grant key";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("for a server app"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradlane::sidecar::test
