// Writes the checked-in seed corpus, tests/fuzz/corpus/<target>/, with the real encoders:
// peer::encode, ps::encode, encode_frame / encode_region_advert / encode_handshake. Shared-memory
// entries have no encoder (the client fills an AppEntry field by field), so they are filled here
// as Client::request / complete / complete_aggregate / applied fill them.
//
//   cmake --build build-fuzz --target gradlane_fuzz_seeds
//   build-fuzz/tests/fuzz/gradlane_fuzz_seeds tests/fuzz/corpus
//
// Each target gets a few valid inputs and a few malformed ones (named bad-*). The entry and ps
// seeds are streams in the format their targets read (see the header of each *_fuzz.cpp).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gradlane/memory.hpp"
#include "sidecar/peer/messages.hpp"
#include "sidecar/shm/layout.hpp"
#include "ps/protocol/messages.hpp"
#include "transport/wire.hpp"

namespace {

namespace fs = std::filesystem;
namespace shm = gradlane::sidecar::shm;
using Bytes = std::vector<std::byte>;

int written = 0;

void write(const fs::path& dir, const std::string& name, std::span<const std::byte> bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + (dir / name).string());
  ++written;
}

// A little-endian stream, in the order the targets' fuzz_util.hpp Input reads it.
class Stream {
 public:
  template <class T>
  Stream& put(T value) {
    static_assert(std::is_integral_v<T> || std::is_enum_v<T>);
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      bytes_.push_back(static_cast<std::byte>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xff));
    }
    return *this;
  }
  template <class T>
  Stream& record(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
    return *this;
  }
  Stream& raw(std::span<const std::byte> bytes) {
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  const Bytes& bytes() const { return bytes_; }

 private:
  Bytes bytes_;
};

// ---- entry_check ----

constexpr std::uint32_t kJob = 7;
constexpr std::uint32_t kEndpoint = 1;
constexpr std::uint64_t kRegion = 1 << 20;

shm::AppEntry submit(std::uint64_t request, std::uint64_t offset, std::uint64_t bytes, float norm) {
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::submit;
  e.job = kJob;
  e.request = request;
  e.body.submit = shm::AppEntry::Submit{.tensor = 3,
                                        .receiver = 2,
                                        .bytes = bytes,
                                        .region_offset = offset,
                                        .computed_on = 5,
                                        .gradient_norm = norm,
                                        .priority = 0,
                                        .job_remaining = 0};
  return e;
}

shm::AppEntry complete(shm::Op op, std::uint64_t request, std::uint32_t failed) {
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = op;
  e.job = kJob;
  e.request = request;
  e.body.complete = shm::AppEntry::Complete{.part = 0, .failed = failed, .measured_ns = 1000, .reserved = {}};
  return e;
}

shm::AppEntry applied(std::uint32_t receiver) {
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::applied;
  e.job = kJob;
  e.body.applied = shm::AppEntry::Applied{.receiver = receiver, .reserved0 = 0, .through = 3, .reserved = {}};
  return e;
}

shm::GrantEntry go(std::uint64_t request) {
  shm::GrantEntry g{};
  g.format = shm::kEntryFormat;
  g.kind = shm::GrantKind::go;
  g.target = 2;
  g.request = request;
  g.sequence = request;
  g.slot_length_ns = 1000;
  g.part_bytes = 4096;
  g.part_count = 1;
  return g;
}

enum Action : std::uint8_t { push_entry, write_slot, publish_tail, drain, push_grants, publish_head };

Stream session() {
  Stream s;
  s.put(kJob).put(kEndpoint).put(kRegion).put(kRegion);  // max_update_bytes = the region
  return s;
}

void entry_check_seeds(const fs::path& dir) {
  {
    Stream s = session();
    s.put(push_entry).record(submit(1, 0, 4096, 1.5F));
    s.put(push_entry).record(complete(shm::Op::complete, 1, 0));
    s.put(push_entry).record(complete(shm::Op::complete_aggregate, 9, 1));
    s.put(push_entry).record(applied(kEndpoint));
    s.put(drain).put(std::uint8_t{15});
    s.put(push_grants).record(go(1)).put(std::uint8_t{2});
    s.put(publish_head).put(std::uint8_t{1}).put(std::uint16_t{2});  // the app read 1 of 3
    s.put(push_grants).record(go(4)).put(std::uint8_t{0});
    write(dir, "session", s.bytes());
  }
  {
    // The grant ring filled to the brim (256 grants), then one more: full.
    Stream s = session();
    s.put(push_grants).record(go(1)).put(std::uint8_t{255});
    s.put(push_grants).record(go(257)).put(std::uint8_t{0});
    write(dir, "grants-full", s.bytes());
  }
  {
    // A full grant ring makes the daemon look at the app's head: one ahead of what it pushed is
    // corrupt, and so is one below zero; a head of 1 frees one slot, then the ring is full again;
    // a head of 0 is then more than a ring behind: corrupt.
    Stream s = session();
    s.put(push_grants).record(go(1)).put(std::uint8_t{255});
    s.put(publish_head).put(std::uint8_t{0}).put(std::uint16_t{1});
    s.put(push_grants).record(go(257)).put(std::uint8_t{0});
    s.put(publish_head).put(std::uint8_t{1}).put(std::uint16_t{257});
    s.put(push_grants).record(go(257)).put(std::uint8_t{0});
    s.put(publish_head).put(std::uint8_t{1}).put(std::uint16_t{255});
    s.put(push_grants).record(go(257)).put(std::uint8_t{1});
    s.put(publish_head).put(std::uint8_t{2}).put(std::uint64_t{0});  // 257 pushed: more than a ring behind
    s.put(push_grants).record(go(258)).put(std::uint8_t{0});
    write(dir, "bad-grant-heads", s.bytes());
  }
  {
    Stream s = session();
    shm::AppEntry bad_format = submit(1, 0, 64, 1.0F);
    bad_format.format = 2;
    shm::AppEntry flags = submit(2, 0, 64, 1.0F);
    flags.flags = 1;
    s.put(push_entry).record(bad_format);
    s.put(push_entry).record(flags);
    s.put(push_entry)
        .record(submit(3, std::numeric_limits<std::uint64_t>::max() - 7, 16, 1.0F));  // offset + bytes wraps
    s.put(push_entry).record(submit(4, kRegion - 8, 16, 1.0F));                       // past the region
    s.put(push_entry).record(submit(5, 0, 64, std::numeric_limits<float>::quiet_NaN()));
    s.put(push_entry).record(complete(shm::Op::complete, 1, 2));
    s.put(push_entry).record(applied(kEndpoint + 1));
    s.put(drain).put(std::uint8_t{15});
    write(dir, "bad-entries", s.bytes());
  }
  {
    // Indices an application scribbled: a tail 2^63 ahead, one a ring and a bit ahead, one
    // behind the head; a grant head far ahead of anything pushed.
    Stream s = session();
    s.put(write_slot).put(std::uint8_t{0}).record(submit(1, 0, 64, 1.0F));
    s.put(publish_tail).put(std::uint8_t{2}).put(std::uint64_t{1} << 63);
    s.put(drain).put(std::uint8_t{3});
    s.put(publish_tail).put(std::uint8_t{0}).put(std::uint16_t{257});
    s.put(drain).put(std::uint8_t{3});
    s.put(publish_tail).put(std::uint8_t{0}).put(std::uint16_t{1});
    s.put(drain).put(std::uint8_t{3});
    s.put(publish_tail).put(std::uint8_t{1}).put(std::uint16_t{5});
    s.put(drain).put(std::uint8_t{3});
    s.put(push_grants).record(go(1)).put(std::uint8_t{0});
    s.put(publish_head).put(std::uint8_t{2}).put(std::uint64_t{1} << 40);
    s.put(push_grants).record(go(2)).put(std::uint8_t{0});
    write(dir, "bad-indices", s.bytes());
  }
}

// ---- peer_messages ----

void peer_seeds(const fs::path& dir) {
  namespace peer = gradlane::peer;
  const peer::SlotRequest request{.request = 1,
                                  .job = 7,
                                  .sender = 1,
                                  .receiver = 2,
                                  .tensor = 3,
                                  .bytes = 4 << 20,
                                  .computed_on = 5,
                                  .gradient_norm = 0.25,
                                  .priority = 1};
  peer::SlotAnswer answer{.kind = peer::AnswerKind::go,
                          .request = 1,
                          .transfer = 11,
                          .part = 0,
                          .part_count = 2,
                          .offset = 0,
                          .length = 2 << 20,
                          .seq = 4,
                          .delay = 1,
                          .start_in_ns = 5000,
                          .length_ns = 2000,
                          .target = 2,
                          .sender = 1,
                          .members = {}};
  peer::SlotAnswer aggregate = answer;
  aggregate.kind = peer::AnswerKind::aggregate;
  aggregate.members = {21, 22, 23};
  peer::SlotAnswer drop = answer;
  drop.kind = peer::AnswerKind::drop;
  drop.transfer = 0;
  write(dir, "hello", peer::encode(peer::Hello{{1, 2}, {}}));
  write(dir, "hello-takeovers", peer::encode(peer::Hello{{1, 2}, {{.endpoint = 0, .epoch = 3, .job = 1}}}));
  write(dir, "slot-request", peer::encode(request));
  write(dir, "slot-answer-go", peer::encode(answer));
  peer::SlotAnswer stamped = answer;
  stamped.token = 0x5eed'70c3'0000'0001ULL;
  write(dir, "slot-answer-go-token", peer::encode(stamped));
  peer::SlotAnswer token_on_drop = drop;
  token_on_drop.token = 7;
  write(dir, "bad-token-on-drop", peer::encode(token_on_drop));
  write(dir, "slot-answer-aggregate", peer::encode(aggregate));
  write(dir, "slot-answer-drop", peer::encode(drop));
  write(dir, "transfer-done", peer::encode(peer::TransferDone{.transfer = 11, .measured_ns = 1800, .failed = false}));
  peer::SlotAnswer moved = drop;
  moved.drop_cause = peer::DropCause::receiver_moved;
  write(dir, "slot-answer-drop-moved", peer::encode(moved));
  peer::SlotAnswer other_job = drop;
  other_job.drop_cause = peer::DropCause::receiver_of_another_job;
  write(dir, "slot-answer-drop-another-job", peer::encode(other_job));
  write(dir, "takeover", peer::encode(peer::Takeover{.endpoint = 2, .version = 62, .epoch = 1, .job = 1}));
  write(dir, "bad-takeover-epoch-0", peer::encode(peer::Takeover{.endpoint = 2, .version = 62, .epoch = 0, .job = 1}));
  peer::SlotAnswer cause_on_go = answer;
  cause_on_go.drop_cause = peer::DropCause::receiver_moved;
  write(dir, "bad-cause-on-go", peer::encode(cause_on_go));

  Bytes truncated = peer::encode(request);
  truncated.resize(truncated.size() - 3);
  write(dir, "bad-truncated", truncated);
  Bytes magic = peer::encode(request);
  magic[0] ^= std::byte{0xff};
  write(dir, "bad-magic", magic);
  write(dir, "bad-hello-empty", peer::encode(peer::Hello{}));  // the decoder wants 1..1024 endpoints
  Bytes trailing = peer::encode(peer::TransferDone{.transfer = 1, .measured_ns = 1, .failed = true});
  trailing.push_back(std::byte{0});
  write(dir, "bad-trailing", trailing);
}

// ---- wire ----

Bytes frame(gradlane::detail::FrameKind kind, std::span<const std::byte> payload) {
  Bytes out(gradlane::detail::kFrameHeaderSize + payload.size());
  gradlane::detail::encode_frame(kind, payload, out);
  return out;
}

void wire_seeds(const fs::path& dir) {
  namespace detail = gradlane::detail;
  using detail::FrameKind;
  const std::string_view text = "gradient update";
  const auto advert = detail::encode_region_advert(3, gradlane::RegionDescriptor{0x7f0000001000, 1 << 20, 0x1234});
  write(dir, "message", frame(FrameKind::message, std::as_bytes(std::span(text))));
  write(dir, "message-empty", frame(FrameKind::message, {}));
  write(dir, "region", frame(FrameKind::region, advert));
  write(dir, "region-payload", advert);
  const auto handshake = detail::encode_handshake("job-key");
  write(dir, "handshake", handshake);
  Bytes padded(handshake.begin(), handshake.end());
  padded.resize(56);  // rdma_cm pads private data to 56 bytes on IB/RoCE
  write(dir, "handshake-padded", padded);
  // Slice bounds (wire_fuzz.cpp reads a descriptor and a slice from any input): a slice that
  // ends exactly at the region's end.
  Stream slice;
  slice.put(std::uint64_t{0x1000})
      .put(std::uint64_t{4096})
      .put(std::uint32_t{1})
      .put(std::uint64_t{4000})
      .put(std::uint64_t{96});
  write(dir, "slice", slice.bytes());

  Bytes short_frame = frame(FrameKind::message, std::as_bytes(std::span(text)));
  short_frame.pop_back();
  write(dir, "bad-length", short_frame);
  Bytes kind = frame(FrameKind::message, std::as_bytes(std::span(text)));
  kind[4] = std::byte{3};
  write(dir, "bad-kind", kind);
  Bytes reserved = frame(FrameKind::message, {});
  reserved[7] = std::byte{1};  // what the fuzzer found decode_frame accepting (tests/unit/wire_test.cpp)
  write(dir, "bad-reserved", reserved);
  const auto wraps = detail::encode_region_advert(4, gradlane::RegionDescriptor{0xfffffffffffff000, 0x2000, 1});
  write(dir, "bad-region-wraps", frame(FrameKind::region, wraps));
  Bytes version(handshake.begin(), handshake.end());
  version[4] = std::byte{2};
  write(dir, "bad-handshake-version", version);
}

// ---- ps ----

enum PsAction : std::uint8_t { message, doorbell, doorbell_to_slot, cancel, apply, widen };

Stream& put_message(Stream& s, const gradlane::ps::Message& m) {
  const Bytes bytes = gradlane::ps::encode(m);
  return s.put(message).put(static_cast<std::uint8_t>(bytes.size())).raw(bytes);
}

void ps_seeds(const fs::path& dir) {
  namespace ps = gradlane::ps;
  {
    Stream s;
    s.put(std::uint8_t{7}).put(std::uint64_t{0});  // 8 slots, first sequence 1
    put_message(s, ps::Hello{ps::PeerKind::worker, 1});
    put_message(s, ps::Hello{ps::PeerKind::primary, 0});
    put_message(s, ps::Request{.worker = 1, .tag = 9, .computed_on = 0});
    put_message(s, ps::Grant{.sequence = 1, .tag = 9, .window_rkey = 0x1234, .token = 0x93f5f5799a932462ULL});
    put_message(s, ps::ReplicaKey{.key = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}});
    put_message(s, ps::Opened{.sequence = 2, .window_rkey = 0x8000123});
    put_message(s, ps::Decided{.sequence = 1, .worker = 1, .tag = 9});
    put_message(s, ps::Ack{.through = 1});
    put_message(s, ps::Bye{.worker = 1});
    put_message(s, ps::FailedOver{.worker = 2});
    put_message(s, ps::Forwarded{.member = 3, .sequence = 7, .delivered = true});
    put_message(s, ps::Hello{ps::PeerKind::replica, 0});
    put_message(s, ps::Adopted{.version = 12});
    put_message(s, ps::ListeningAt{.kind = ps::PeerKind::replica, .address = "198.18.0.10", .port = 7803});
    put_message(s, ps::ListeningAt{.kind = ps::PeerKind::aggregator, .address = "fe80::1", .port = 7802});
    put_message(s, ps::Mirroring{.worker = 2, .from = 60});
    put_message(s, ps::Claim{.sequence = 2, .token = 0x93f5f5799a932462ULL});
    put_message(s, ps::AskLanded{.worker = 1});
    put_message(s, ps::Landed{.tag = 126, .sequence = 379, .computed_on = 376});
    put_message(s, ps::Hello{ps::PeerKind::worker, 3, ps::Addressed::replica});
    put_message(s, ps::Refused{ps::RefusedWhy::version_from_future, 9, 1});
    put_message(s, ps::Refused{ps::RefusedWhy::not_the_server, 9, 0});
    put_message(s, ps::Pushing{.sequence = 3, .tag = 126, .computed_on = 2});
    put_message(s, ps::Landed{});
    s.put(doorbell).put(std::uint32_t{1});
    s.put(doorbell).put(std::uint32_t{2});
    s.put(cancel).put(std::int16_t{2});  // sequence 3
    s.put(apply).put(apply).put(apply);
    s.put(doorbell_to_slot).put(std::uint32_t{4}).put(std::uint32_t{5});
    s.put(apply);
    s.put(widen).put(std::uint32_t{0xffffffff}).put((std::uint64_t{1} << 32) + 5);
    write(dir, "server", s.bytes());
  }
  {
    // Sequences across 2^32, where the 32-bit immediate wraps.
    Stream s;
    s.put(std::uint8_t{3}).put((std::uint64_t{1} << 32) - 3);  // 4 slots, first sequence 2^32 - 2
    s.put(doorbell).put(std::uint32_t{0xfffffffe});
    s.put(doorbell).put(std::uint32_t{0xffffffff});
    s.put(doorbell).put(std::uint32_t{0});
    s.put(apply).put(apply).put(apply);
    write(dir, "imm-wrap", s.bytes());
  }
  {
    Stream s;
    s.put(std::uint8_t{3}).put(std::uint64_t{0});
    Bytes short_request = ps::encode(ps::Request{.worker = 1, .tag = 2, .computed_on = 3});
    short_request.pop_back();
    s.put(message).put(static_cast<std::uint8_t>(short_request.size())).raw(short_request);
    const std::byte unknown[] = {std::byte{9}, std::byte{0}};
    s.put(message).put(std::uint8_t{2}).raw(unknown);
    put_message(s, ps::Hello{ps::PeerKind::worker, 0});  // worker ids start at 1
    s.put(doorbell).put(std::uint32_t{100});             // beyond the window
    s.put(doorbell).put(std::uint32_t{1});
    s.put(doorbell).put(std::uint32_t{1});                                // twice
    s.put(cancel).put(std::int16_t{0});                                   // cancel what arrived
    s.put(doorbell_to_slot).put(std::uint32_t{2}).put(std::uint32_t{1});  // slot 1 busy
    s.put(doorbell_to_slot).put(std::uint32_t{3}).put(std::uint32_t{9});  // no slot 9
    s.put(apply);
    s.put(doorbell).put(std::uint32_t{1});  // already done
    write(dir, "bad-arrivals", s.bytes());
  }
}

// ---- peer_policy: actions as peer_policy_fuzz.cpp reads them ----

class Actions {
 public:
  Actions& u8(std::uint8_t v) { return put(v); }
  Actions& u16(std::uint16_t v) { return put(v); }
  Actions& u32(std::uint32_t v) { return put(v); }
  Actions& submit(std::uint8_t id_minus_1, std::uint8_t sender, std::uint32_t bytes_minus_1) {
    return u8(0).u8(id_minus_1).u8(sender).u32(bytes_minus_1);
  }
  Actions& to_b(std::span<const std::byte> message) { return message_to(1, message); }
  Actions& to_a(std::span<const std::byte> message) { return message_to(2, message); }
  Actions& schedule() { return u8(3); }
  Actions& complete(std::uint16_t measured, bool failed) { return u8(4).u16(measured).u8(failed ? 1 : 0); }
  Actions& fail_link() { return u8(6); }
  const Bytes& bytes() const { return out_; }

 private:
  template <class T>
  Actions& put(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<std::byte>(v >> (8 * i)));
    return *this;
  }
  Actions& message_to(std::uint8_t action, std::span<const std::byte> message) {
    u8(action).u16(static_cast<std::uint16_t>(message.size()));
    out_.insert(out_.end(), message.begin(), message.end());
    return *this;
  }
  Bytes out_;
};

void peer_policy_seeds(const fs::path& dir) {
  namespace peer = gradlane::peer;
  // B forwards request 1 (1000 bytes from endpoint 1); the honest exchange.
  write(dir, "honest", Actions{}.submit(0, 0, 999).schedule().complete(500, false).schedule().bytes());
  peer::SlotAnswer go{.kind = peer::AnswerKind::go,
                      .request = 1,
                      .transfer = 100,
                      .part = 0,
                      .part_count = 2,
                      .offset = 0,
                      .length = 500,
                      .seq = 1,
                      .delay = 0,
                      .start_in_ns = 0,
                      .length_ns = 1000,
                      .target = 0,
                      .sender = 1,
                      .members = {}};
  peer::SlotAnswer resplit = go;
  resplit.part = 100000;
  resplit.part_count = 100001;
  resplit.transfer = 101;
  write(dir, "resplit-answer",
        Actions{}.submit(0, 0, 999).to_b(peer::encode(go)).to_b(peer::encode(resplit)).schedule().bytes());
  write(dir, "duplicate-answer",
        Actions{}.submit(0, 0, 999).to_b(peer::encode(go)).to_b(peer::encode(go)).schedule().bytes());
  // A 16 MiB request split into a part per byte, then the link fails: taken, B would drop each
  // undecided part, 16 million outcomes (past libFuzzer's 10 s timeout).
  peer::SlotAnswer fine = go;
  fine.part_count = 16u << 20;
  fine.length = 1;
  write(dir, "many-parts",
        Actions{}.submit(0, 0, (16u << 20) - 1).to_b(peer::encode(fine)).schedule().fail_link().schedule().bytes());
  const peer::SlotRequest request{.request = 9,
                                  .job = 1,
                                  .sender = 1,
                                  .receiver = 0,
                                  .tensor = 1,
                                  .bytes = 4096,
                                  .computed_on = 0,
                                  .gradient_norm = 1.0,
                                  .priority = 0};
  write(dir, "peer-requests", Actions{}.to_a(peer::encode(request)).schedule().bytes());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR   (writes CORPUS_DIR/<target>/<seed>)\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  entry_check_seeds(root / "entry_check");
  peer_seeds(root / "peer_messages");
  wire_seeds(root / "wire");
  ps_seeds(root / "ps");
  peer_policy_seeds(root / "peer_policy");
  std::printf("wrote %d seeds under %s\n", written, root.c_str());
  return 0;
}
