#include "sidecar/peer/messages.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <string>

#include "common/le_codec.hpp"

namespace gradlane::peer {
namespace {

enum class Type : std::uint16_t { hello = 1, slot_request = 2, slot_answer = 3, transfer_done = 4, takeover = 5 };

// A peer that claims more than this is lying (or broken): no real tensor part is 1 TiB, no
// sidecar hosts 1024 NICs, no aggregate has 65536 members.
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 40;
constexpr std::uint32_t kMaxEndpoints = 1024;
constexpr std::uint32_t kMaxMembers = 65536;
// Slot times are relative to the answer; one further out than this is no slot a receiver
// grants (its grant lifetime is seconds), and near 2^63 it overflows the local clock's sum.
constexpr std::int64_t kMaxSlotNanos = std::int64_t{600} * 1'000'000'000;

using Writer = wire::LeWriter;
using Reader = wire::LeReader;

[[noreturn]] void bad(const std::string& what) { throw Error(Errc::protocol, "peer message: " + what); }

void header(Writer& w, Type type) {
  w.put(kMagic);
  w.put(kVersion);
  w.put(static_cast<std::uint16_t>(type));
}

}  // namespace

std::vector<std::byte> encode(const Message& message) {
  Writer w;
  std::visit(
      [&](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, Hello>) {
          header(w, Type::hello);
          w.put(static_cast<std::uint32_t>(m.endpoints.size()));
          for (auto e : m.endpoints) w.put(e);
          w.put(static_cast<std::uint32_t>(m.takeovers.size()));
          for (const TakeoverMark& t : m.takeovers) w.put(t.endpoint), w.put(t.epoch), w.put(t.job);
        } else if constexpr (std::is_same_v<M, SlotRequest>) {
          header(w, Type::slot_request);
          w.put(m.request), w.put(m.job), w.put(m.sender), w.put(m.receiver), w.put(m.tensor);
          w.put(m.bytes), w.put(m.computed_on), w.put(m.gradient_norm), w.put(m.priority);
          w.put(m.job_remaining), w.put(std::uint8_t{m.direct_only});
        } else if constexpr (std::is_same_v<M, SlotAnswer>) {
          header(w, Type::slot_answer);
          w.put(static_cast<std::uint8_t>(m.kind));
          w.put(static_cast<std::uint8_t>(m.drop_cause));
          w.put(m.request), w.put(m.transfer), w.put(m.part), w.put(m.part_count), w.put(m.offset);
          w.put(m.length), w.put(m.seq), w.put(m.delay), w.put(m.start_in_ns), w.put(m.length_ns);
          w.put(m.target), w.put(m.sender), w.put(m.token);
          w.put(static_cast<std::uint32_t>(m.members.size()));
          for (auto id : m.members) w.put(id);
        } else if constexpr (std::is_same_v<M, Takeover>) {
          header(w, Type::takeover);
          w.put(m.endpoint), w.put(m.version), w.put(m.epoch), w.put(m.job);
        } else {
          header(w, Type::transfer_done);
          w.put(m.transfer), w.put(m.measured_ns), w.put(static_cast<std::uint8_t>(m.failed ? 1 : 0));
        }
      },
      message);
  return w.take();
}

Message decode(std::span<const std::byte> bytes) {
  Reader r(bytes, "peer message");
  if (const auto magic = r.get<std::uint32_t>("magic"); magic != kMagic) {
    bad(fmt::format("magic {:#010x}, expected {:#010x} (not a gradlaned peer)", magic, kMagic));
  }
  if (const auto version = r.get<std::uint16_t>("version"); version != kVersion) {
    bad(fmt::format("protocol version {}, this gradlaned speaks {}", version, kVersion));
  }
  const auto type = r.get<std::uint16_t>("type");
  switch (static_cast<Type>(type)) {
    case Type::hello: {
      Hello m;
      const auto n = r.get<std::uint32_t>("endpoint count");
      if (n == 0 || n > kMaxEndpoints) bad(fmt::format("hello lists {} endpoints (1..{})", n, kMaxEndpoints));
      for (std::uint32_t i = 0; i < n; ++i) m.endpoints.push_back(r.get<std::uint32_t>("endpoint"));
      const auto marks = r.get<std::uint32_t>("takeover count");
      if (marks > kMaxTakeoverMarks)
        bad(fmt::format("hello lists {} takeovers (at most {})", marks, kMaxTakeoverMarks));
      for (std::uint32_t i = 0; i < marks; ++i) {
        TakeoverMark t;
        t.endpoint = r.get<std::uint32_t>("takeover endpoint");
        t.epoch = r.get<std::uint64_t>("takeover epoch");
        t.job = r.get<std::uint32_t>("takeover job");
        if (t.epoch == 0)
          bad(fmt::format("hello lists a takeover of endpoint {} at epoch 0 (they start at 1)", t.endpoint));
        m.takeovers.push_back(t);
      }
      r.expect_end("hello");
      return m;
    }
    case Type::slot_request: {
      SlotRequest m;
      m.request = r.get<std::uint64_t>("request");
      m.job = r.get<std::uint32_t>("job");
      m.sender = r.get<std::uint32_t>("sender");
      m.receiver = r.get<std::uint32_t>("receiver");
      m.tensor = r.get<std::uint32_t>("tensor");
      m.bytes = r.get<std::uint64_t>("bytes");
      m.computed_on = r.get<std::uint64_t>("computed_on");
      m.gradient_norm = r.get<double>("gradient_norm");
      m.priority = r.get<std::uint32_t>("priority");
      m.job_remaining = r.get<std::uint64_t>("job_remaining");
      const auto direct_only = r.get<std::uint8_t>("direct_only");
      if (direct_only > 1) bad(fmt::format("slot request with direct_only {}", direct_only));
      m.direct_only = direct_only == 1;
      r.expect_end("slot request");
      if (m.bytes == 0 || m.bytes > kMaxBytes) bad(fmt::format("slot request of {} bytes", m.bytes));
      if (!std::isfinite(m.gradient_norm)) bad("slot request with a non-finite gradient norm");
      if (m.sender == m.receiver) bad("slot request whose sender is its receiver");
      return m;
    }
    case Type::slot_answer: {
      SlotAnswer m;
      const auto kind = r.get<std::uint8_t>("kind");
      if (kind < 1 || kind > 4) bad(fmt::format("slot answer of unknown kind {}", kind));
      m.kind = static_cast<AnswerKind>(kind);
      const auto cause = r.get<std::uint8_t>("drop_cause");
      if (cause > static_cast<std::uint8_t>(DropCause::version_from_future)) {
        bad(fmt::format("slot answer with unknown drop cause {}", cause));
      }
      if (cause != 0 && m.kind != AnswerKind::drop) bad("a drop cause on an answer that is not a drop");
      m.drop_cause = static_cast<DropCause>(cause);
      m.request = r.get<std::uint64_t>("request");
      m.transfer = r.get<std::uint64_t>("transfer");
      m.part = r.get<std::uint32_t>("part");
      m.part_count = r.get<std::uint32_t>("part_count");
      m.offset = r.get<std::uint64_t>("offset");
      m.length = r.get<std::uint64_t>("length");
      m.seq = r.get<std::uint64_t>("seq");
      m.delay = r.get<std::uint64_t>("delay");
      m.start_in_ns = r.get<std::int64_t>("start_in_ns");
      m.length_ns = r.get<std::int64_t>("length_ns");
      m.target = r.get<std::uint32_t>("target");
      m.sender = r.get<std::uint32_t>("sender");
      m.token = r.get<std::uint64_t>("token");
      const auto members = r.get<std::uint32_t>("member count");
      if (members > kMaxMembers) bad(fmt::format("aggregate of {} members", members));
      for (std::uint32_t i = 0; i < members; ++i) m.members.push_back(r.get<std::uint64_t>("member"));
      r.expect_end("slot answer");
      if (m.part_count == 0 || m.part >= m.part_count) bad(fmt::format("part {} of {}", m.part, m.part_count));
      if (m.length > kMaxBytes || m.offset > kMaxBytes) bad("slot answer with an absurd offset or length");
      if (m.start_in_ns < 0 || m.length_ns < 0) bad("slot answer with a negative slot time");
      if (m.start_in_ns > kMaxSlotNanos || m.length_ns > kMaxSlotNanos) {
        bad(fmt::format("slot answer with a slot {} ns away, {} ns long (at most {} each)", m.start_in_ns, m.length_ns,
                        kMaxSlotNanos));
      }
      if (m.kind != AnswerKind::drop && m.transfer == 0) bad("slot answer without a transfer id");
      if (m.token != 0 && m.kind != AnswerKind::go && m.kind != AnswerKind::aggregate) {
        bad("a grant token on an answer that grants no sequence");
      }
      return m;
    }
    case Type::transfer_done: {
      TransferDone m;
      m.transfer = r.get<std::uint64_t>("transfer");
      m.measured_ns = r.get<std::int64_t>("measured_ns");
      const auto failed = r.get<std::uint8_t>("failed");
      r.expect_end("transfer done");
      if (failed > 1) bad("transfer done with a failed flag other than 0/1");
      if (m.measured_ns < 0) bad("transfer done with a negative duration");
      m.failed = failed == 1;
      return m;
    }
    case Type::takeover: {
      Takeover m;
      m.endpoint = r.get<std::uint32_t>("endpoint");
      m.version = r.get<std::uint64_t>("version");
      m.epoch = r.get<std::uint64_t>("epoch");
      m.job = r.get<std::uint32_t>("job");
      if (m.epoch == 0) bad(fmt::format("takeover of endpoint {} at epoch 0 (they start at 1)", m.endpoint));
      r.expect_end("takeover");
      return m;
    }
  }
  bad(fmt::format("unknown message type {}", type));
}

}  // namespace gradlane::peer
