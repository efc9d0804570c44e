// The parameter server's control messages on the wire (ps/protocol/messages.hpp), through the shared
// little-endian codec: every kind decodes to what was encoded; a message cut short, or longer
// than its fields, is Error(protocol) naming the kind, never a read past the bytes received.
#include "ps/protocol/messages.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradlane/error.hpp"

namespace gradlane::ps {
namespace {

std::vector<Message> one_of_each() {
  ReplicaKey key;
  for (std::size_t i = 0; i < key.key.size(); ++i) key.key[i] = static_cast<std::uint8_t>(i + 1);
  return {Hello{PeerKind::worker, 7},
          Request{7, 11, 13},
          Grant{17, 11, 0x1234, 0xfeed},
          Decided{17, 7, 11},
          Ack{17},
          Bye{7},
          FailedOver{7},
          Forwarded{19, 23, true},
          Adopted{29},
          ListeningAt{PeerKind::aggregator, "198.18.0.12", 7600},
          Mirroring{7, 31},
          Claim{37, 41},
          key,
          Opened{37, 0x55},
          AskLanded{7},
          Landed{11, 43, 13},
          Refused{RefusedWhy::version_from_future, 11, 43},
          Pushing{43, 11, 13},
          Dropped{7}};
}

TEST(PsMessages, EveryKindDecodesToWhatWasEncoded) {
  const std::vector<Message> messages = one_of_each();
  ASSERT_EQ(messages.size(), std::variant_size_v<Message>);
  for (const Message& m : messages) {
    const std::vector<std::byte> bytes = encode(m);
    const Message back = decode(bytes);
    EXPECT_EQ(back.index(), m.index());
    EXPECT_EQ(encode(back), bytes) << "kind " << m.index() + 1;
  }
  const auto at = std::get<ListeningAt>(decode(encode(ListeningAt{PeerKind::replica, "fe80::1", 9})));
  EXPECT_EQ(at.address, "fe80::1");
  EXPECT_EQ(at.port, 9);
}

TEST(PsMessages, AMessageCutShortOrTooLongIsAProtocolErrorNamingItsKind) {
  for (const Message& m : one_of_each()) {
    std::vector<std::byte> bytes = encode(m);
    const std::string kind = "kind " + std::to_string(m.index() + 1);
    std::vector<std::byte> shorter(bytes.begin(), bytes.end() - 1);
    try {
      (void)decode(shorter);
      ADD_FAILURE() << kind << " decoded with a byte missing";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::protocol);
      EXPECT_NE(std::string(e.what()).find(kind + " truncated"), std::string::npos) << e.what();
    }
    bytes.push_back(std::byte{0});
    try {
      (void)decode(bytes);
      ADD_FAILURE() << kind << " decoded with a byte too many";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::protocol);
      EXPECT_NE(std::string(e.what()).find(kind + " has 1 trailing bytes"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW((void)decode({}), Error);
}

TEST(PsMessages, EveryRefusalReasonDecodesToItself) {
  for (const RefusedWhy why : {RefusedWhy::version_from_future, RefusedWhy::not_the_server, RefusedWhy::round_closed}) {
    const auto back = std::get<Refused>(decode(encode(Refused{why, 11, 43})));
    EXPECT_EQ(back.why, why) << static_cast<int>(why);
  }
}

TEST(PsMessages, ARefusalForAnUnknownReasonIsAProtocolError) {
  std::vector<std::byte> bytes = encode(Refused{RefusedWhy::version_from_future, 11, 43});
  bytes[1] = std::byte{9};
  try {
    (void)decode(bytes);
    ADD_FAILURE() << "a refusal for reason 9 decoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::protocol);
    EXPECT_NE(std::string(e.what()).find("unknown reason (9)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradlane::ps
