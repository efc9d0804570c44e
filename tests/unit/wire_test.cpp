// Control-message framing: a peer is untrusted, so every malformed frame must be refused
// with an Error(protocol) that says what is wrong.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "transport/wire.hpp"

namespace gradlane::detail {
namespace {

std::vector<std::byte> frame(FrameKind kind, std::string_view payload) {
  std::vector<std::byte> out(kFrameHeaderSize + payload.size());
  encode_frame(kind, std::as_bytes(std::span(payload)), out);
  return out;
}

void expect_protocol_error(std::span<const std::byte> bytes, const std::string& fragment) {
  try {
    decode_frame(bytes);
    FAIL() << "accepted a malformed frame";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::protocol);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Wire, MessageRoundTrips) {
  const auto bytes = frame(FrameKind::message, "hello");
  const Frame f = decode_frame(bytes);
  EXPECT_EQ(f.kind, FrameKind::message);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()), "hello");
}

TEST(Wire, EmptyPayloadIsValid) { EXPECT_TRUE(decode_frame(frame(FrameKind::message, "")).payload.empty()); }

TEST(Wire, ShortFrameIsRefused) {
  const auto bytes = frame(FrameKind::message, "x");
  expect_protocol_error(std::span(bytes).first(5), "shorter than");
}

TEST(Wire, BadMagicIsRefused) {
  auto bytes = frame(FrameKind::message, "x");
  bytes[0] = std::byte{0};
  expect_protocol_error(bytes, "magic");
}

TEST(Wire, LengthMismatchIsRefused) {
  auto bytes = frame(FrameKind::message, "abcd");
  bytes.pop_back();
  expect_protocol_error(bytes, "says 4 payload bytes but 3 arrived");
  auto longer = frame(FrameKind::message, "abcd");
  longer.push_back(std::byte{0});
  expect_protocol_error(longer, "but 5 arrived");
}

TEST(Wire, UnknownKindIsRefused) {
  auto bytes = frame(FrameKind::message, "x");
  bytes[4] = std::byte{99};
  expect_protocol_error(bytes, "unknown kind 99");
}

// Header bytes 6-7 are reserved: encode_frame writes them as 0, and decode_frame refuses a frame
// with them set (GLC1 01 00 00 01 ...: reserved 0x0100; a case tests/fuzz (wire) reaches).
TEST(Wire, ReservedHeaderBytesMustBeZero) {
  for (const std::size_t at : {std::size_t{6}, std::size_t{7}}) {
    auto bytes = frame(FrameKind::message, "x");
    bytes[at] = std::byte{1};
    expect_protocol_error(bytes, "reserved bytes");
  }
}

TEST(Wire, OversizedPayloadIsRefusedWhenEncoding) {
  std::vector<std::byte> out(kFrameHeaderSize + 3);
  const std::string big = "four";
  EXPECT_THROW(encode_frame(FrameKind::message, std::as_bytes(std::span(big)), out), Error);
}

TEST(Wire, RegionAdvertRoundTripsAndChecksItsSize) {
  const RegionDescriptor d{0x7f0000001000ull, 1u << 20, 0x1234};
  const auto advert = encode_region_advert(42, d);
  const RegionAdvert back = decode_region_advert(advert);
  EXPECT_EQ(back.id, 42u);
  EXPECT_EQ(back.region, d);
  EXPECT_THROW(decode_region_advert(std::span(advert).first(10)), Error);
}

TEST(Wire, RegionAdvertThatWrapsTheAddressSpaceIsRefused) {
  const RegionDescriptor d{~std::uint64_t{0} - 100, 4096, 1};
  const auto advert = encode_region_advert(1, d);
  try {
    decode_region_advert(advert);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::protocol);
  }
}

TEST(Wire, HandshakeChecksMagicAndVersion) {
  auto hs = encode_handshake("");
  std::vector<std::byte> padded(hs.begin(), hs.end());
  padded.resize(56);  // rdma_cm pads private data
  EXPECT_NO_THROW(check_handshake(padded));
  EXPECT_THROW(check_handshake(std::span(hs).first(4)), Error);
  auto wrong_version = hs;
  wrong_version[4] = std::byte{9};
  try {
    check_handshake(wrong_version);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("version 9"), std::string::npos) << e.what();
  }
  std::array<std::byte, 8> stranger{};
  EXPECT_THROW(check_handshake(stranger), Error);
}

TEST(Wire, HandshakeCarriesTheJobKeyAndOnlyTheSameKeyMatches) {
  const std::string key = "job-7:0123456789abcdef0123456789";  // 31 bytes
  auto hs = encode_handshake(key);
  std::vector<std::byte> padded(hs.begin(), hs.end());
  padded.resize(56);
  EXPECT_NO_THROW(check_handshake(padded));
  EXPECT_TRUE(same_job_key(padded, key));
  EXPECT_FALSE(same_job_key(padded, "")) << "a listener without a key refuses a keyed peer";
  EXPECT_FALSE(same_job_key(encode_handshake(""), key)) << "and a keyed one refuses a peer without";
  EXPECT_FALSE(same_job_key(padded, key.substr(0, 30))) << "a prefix of the key is not the key";
  EXPECT_FALSE(same_job_key(padded, key + "x"));
  std::string one_off = key;
  one_off[12] ^= 1;
  EXPECT_FALSE(same_job_key(padded, one_off));
  EXPECT_TRUE(same_job_key(encode_handshake(""), ""));
  const std::string full(kMaxJobKeyBytes, 'k');
  EXPECT_TRUE(same_job_key(encode_handshake(full), full));
  EXPECT_FALSE(same_job_key(std::span(hs).first(kHandshakeSize - 1), key)) << "a truncated handshake";
}

TEST(Wire, ARefusalSaysWhy) {
  EXPECT_EQ(decode_refusal(encode_refusal(Refusal::job_key)), Refusal::job_key);
  EXPECT_EQ(decode_refusal(encode_refusal(Refusal::busy)), Refusal::busy);
  std::array<std::byte, 8> bare{};
  EXPECT_FALSE(decode_refusal(bare).has_value()) << "a reject without our reason (nothing listening, …)";
  auto other = encode_refusal(Refusal::job_key);
  other[4] = std::byte{9};
  EXPECT_FALSE(decode_refusal(other).has_value());
}

TEST(TransportOptionsJobKey, ComesFromTheEnvironmentAndIsBounded) {
  const auto env = [](const char* value) {
    return [value](const char* name) -> std::optional<std::string> {
      if (std::string(name) == "GRADLANE_JOB_KEY") return std::string(value);
      return std::nullopt;
    };
  };
  EXPECT_EQ(TransportOptions::from_env(env("s3cret")).job_key, "s3cret");
  try {
    TransportOptions::from_env(env("0123456789012345678901234567890123"));  // 34 bytes
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("GRADLANE_JOB_KEY"), std::string::npos) << e.what();
  }
}

TEST(SplitIntoMessages, CoversTheOperationInOrderInSpansThePortCarries) {
  // 4 GiB + 4 KiB once went out as one 4 KiB work request (a length is 32 bits).
  const std::uint64_t length = (std::uint64_t{4} << 30) + 4096, largest = std::uint64_t{8} << 20;
  const auto spans = split_into_messages(length, largest);
  ASSERT_EQ(spans.size(), 513u);
  std::uint64_t next = 0;
  for (const MessageSpan& span : spans) {
    EXPECT_EQ(span.offset, next);
    EXPECT_GT(span.length, 0u);
    EXPECT_LE(span.length, largest);
    next += span.length;
  }
  EXPECT_EQ(next, length);
  EXPECT_EQ(spans.back().length, 4096u);
  // One message when it fits; one empty span for a doorbell; never over 2^31 whatever the port says.
  EXPECT_EQ(split_into_messages(largest, largest).size(), 1u);
  ASSERT_EQ(split_into_messages(0, largest).size(), 1u);
  EXPECT_EQ(split_into_messages(0, largest)[0].length, 0u);
  const auto huge_port = split_into_messages(std::uint64_t{5} << 30, std::uint64_t{1} << 40);
  ASSERT_EQ(huge_port.size(), 3u);
  EXPECT_EQ(huge_port[0].length, std::uint32_t{1} << 31);
}

using Env = std::map<std::string, std::string>;
std::function<std::optional<std::string>(const char*)> fake(Env vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

std::string error_of(const Env& vars) {
  try {
    TransportOptions::from_env(fake(vars));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    return e.what();
  }
  return "<accepted>";
}

TEST(TransportOptionsJobKey, AProgramWithoutAKeyRefusesToRunUnlessToldInsecure) {
  const std::string refusal = error_of({});
  EXPECT_NE(refusal.find("no job key"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("GRADLANE_JOB_KEY_FILE"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("GRADLANE_INSECURE=1"), std::string::npos) << refusal;
  EXPECT_NE(error_of({{"GRADLANE_INSECURE", "0"}}), "<accepted>");
  const TransportOptions insecure = TransportOptions::from_env(fake({{"GRADLANE_INSECURE", "1"}}));
  EXPECT_TRUE(insecure.insecure);
  EXPECT_TRUE(insecure.job_key.empty());
}

class KeyFile : public ::testing::Test {
 protected:
  std::string path = fmt::format("/tmp/gradlane-key-test-{}", ::getpid());
  void write(const std::string& content, mode_t mode) {
    ::unlink(path.c_str());
    std::ofstream(path) << content;
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
  }
  void TearDown() override { ::unlink(path.c_str()); }
};

TEST_F(KeyFile, IsReadFromItsFirstLineWhenOnlyItsOwnerCanReadIt) {
  write("c2VjcmV0IGtleQ==\nsecond line ignored\n", 0600);
  EXPECT_EQ(TransportOptions::from_env(fake({{"GRADLANE_JOB_KEY_FILE", path}})).job_key, "c2VjcmV0IGtleQ==");
  write("k", 0400);
  EXPECT_EQ(TransportOptions::read_key_file(path), "k");
}

TEST_F(KeyFile, IsRefusedWhenOthersCanReadItOrItIsNoKey) {
  write("s3cret\n", 0644);
  const std::string loose = error_of({{"GRADLANE_JOB_KEY_FILE", path}});
  EXPECT_NE(loose.find("mode 0644"), std::string::npos) << loose;
  EXPECT_NE(loose.find("chmod 600"), std::string::npos) << loose;
  write("s3cret\n", 0640);
  EXPECT_NE(error_of({{"GRADLANE_JOB_KEY_FILE", path}}).find("mode 0640"), std::string::npos);
  write("\n", 0600);
  EXPECT_NE(error_of({{"GRADLANE_JOB_KEY_FILE", path}}).find("empty"), std::string::npos);
  write(std::string(40, 'k'), 0600);
  EXPECT_NE(error_of({{"GRADLANE_JOB_KEY_FILE", path}}).find("longer than 32"), std::string::npos);
  EXPECT_NE(error_of({{"GRADLANE_JOB_KEY_FILE", path + "-missing"}}).find("No such file"), std::string::npos);
  write("s3cret", 0600);
  EXPECT_NE(error_of({{"GRADLANE_JOB_KEY_FILE", path}, {"GRADLANE_JOB_KEY", "x"}}).find("keep one"), std::string::npos);
  // A link is not followed: the file checked is the file named.
  const std::string link = path + "-link";
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  EXPECT_NE(error_of({{"GRADLANE_JOB_KEY_FILE", link}}), "<accepted>");
  ::unlink(link.c_str());
}

}  // namespace
}  // namespace gradlane::detail
