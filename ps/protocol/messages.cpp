#include "ps/protocol/messages.hpp"

#include <fmt/format.h>

#include <cstring>

#include "common/le_codec.hpp"
#include "common/overloaded.hpp"
#include "gradlane/error.hpp"

namespace gradlane::ps {
namespace {

// Wire: byte 0 = kind (the variant index + 1), then the fields, little-endian, packed.
enum class Kind : std::uint8_t {
  hello = 1,
  request,
  grant,
  decided,
  ack,
  bye,
  failed_over,
  forwarded,
  adopted,
  listening_at,
  mirroring,
  claim,
  replica_key,
  opened,
  ask_landed,
  landed,
  refused,
  pushing,
  dropped
};
// A message: its kind, then its fields.
class Writer {
 public:
  explicit Writer(Kind kind) { out_.put(static_cast<std::uint8_t>(kind)); }
  template <class T>
  Writer& put(T value) {
    out_.put(value);
    return *this;
  }
  Writer& put_text(const std::string& text, std::size_t size) {
    out_.put_text(text, size);
    return *this;
  }
  std::vector<std::byte> done() { return out_.take(); }

 private:
  wire::LeWriter out_{32};
};

// A NUL-padded address literal: hex digits, '.' and ':' only, at least one.
std::string get_address(wire::LeReader& in, std::size_t size) {
  std::string text;
  bool ended = false;
  for (const std::byte b : in.take(size, "address")) {
    const char c = static_cast<char>(std::to_integer<std::uint8_t>(b));
    if (c == '\0') {
      ended = true;
      continue;
    }
    const bool allowed =
        (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == '.' || c == ':';
    if (ended || !allowed) throw Error(Errc::protocol, "an address that is not a NUL-padded IP literal");
    text.push_back(c);
  }
  if (text.empty()) throw Error(Errc::protocol, "an empty address");
  return text;
}

// The fields of a message of `kind`, checked; decode() then checks nothing is left over.
Message decode_fields(Kind kind, wire::LeReader& in);

}  // namespace

std::vector<std::byte> encode(const Message& message) {
  return std::visit(
      detail::Overloaded{
          [](const Hello& m) { return Writer(Kind::hello).put(m.kind).put(m.worker).put(m.addressed).done(); },
          [](const Request& m) { return Writer(Kind::request).put(m.worker).put(m.tag).put(m.computed_on).done(); },
          [](const Grant& m) {
            return Writer(Kind::grant).put(m.sequence).put(m.tag).put(m.window_rkey).put(m.token).done();
          },
          [](const Decided& m) { return Writer(Kind::decided).put(m.sequence).put(m.worker).put(m.tag).done(); },
          [](const Ack& m) { return Writer(Kind::ack).put(m.through).done(); },
          [](const Bye& m) { return Writer(Kind::bye).put(m.worker).done(); },
          [](const FailedOver& m) { return Writer(Kind::failed_over).put(m.worker).done(); },
          [](const Forwarded& m) {
            return Writer(Kind::forwarded).put(m.member).put(m.sequence).put(std::uint8_t{m.delivered}).done();
          },
          [](const Adopted& m) { return Writer(Kind::adopted).put(m.version).done(); },
          [](const ListeningAt& m) {
            return Writer(Kind::listening_at)
                .put(m.kind)
                .put_text(m.address, ListeningAt::kAddressBytes)
                .put(m.port)
                .done();
          },
          [](const Mirroring& m) { return Writer(Kind::mirroring).put(m.worker).put(m.from).done(); },
          [](const Claim& m) { return Writer(Kind::claim).put(m.sequence).put(m.token).done(); },
          [](const Opened& m) { return Writer(Kind::opened).put(m.sequence).put(m.window_rkey).done(); },
          [](const AskLanded& m) { return Writer(Kind::ask_landed).put(m.worker).done(); },
          [](const Landed& m) { return Writer(Kind::landed).put(m.tag).put(m.sequence).put(m.computed_on).done(); },
          [](const Refused& m) { return Writer(Kind::refused).put(m.why).put(m.tag).put(m.version).done(); },
          [](const Pushing& m) { return Writer(Kind::pushing).put(m.sequence).put(m.tag).put(m.computed_on).done(); },
          [](const Dropped& m) { return Writer(Kind::dropped).put(m.worker).done(); },
          [](const ReplicaKey& m) {
            Writer w(Kind::replica_key);
            for (const std::uint8_t b : m.key) w.put(b);
            return w.done();
          },
      },
      message);
}

Message decode(std::span<const std::byte> bytes) {
  if (bytes.empty()) throw Error(Errc::protocol, "empty parameter-server message");
  const auto kind = std::to_integer<std::uint8_t>(bytes[0]);
  if (kind < 1 || kind > static_cast<std::uint8_t>(Kind::dropped)) {
    throw Error(Errc::protocol, fmt::format("unknown parameter-server message kind {}", kind));
  }
  wire::LeReader in(bytes.subspan(1), "parameter-server message of kind", kind);
  Message message = decode_fields(static_cast<Kind>(kind), in);
  in.expect_end();
  return message;
}

namespace {

Message decode_fields(Kind kind, wire::LeReader& in) {
  switch (kind) {
    case Kind::hello: {
      Hello m;
      m.kind = in.get<PeerKind>();
      m.worker = in.get<std::uint32_t>();
      m.addressed = in.get<Addressed>();
      if (m.addressed != Addressed::server && m.addressed != Addressed::replica) {
        throw Error(Errc::protocol,
                    fmt::format("hello addressed to an unknown role ({})", static_cast<int>(m.addressed)));
      }
      if (m.kind != PeerKind::worker && m.kind != PeerKind::primary && m.kind != PeerKind::replica) {
        throw Error(Errc::protocol, fmt::format("hello from an unknown kind of peer ({})", static_cast<int>(m.kind)));
      }
      if (m.kind == PeerKind::worker && m.worker == 0)
        throw Error(Errc::protocol, "hello from worker id 0 (ids start at 1)");
      if (m.kind == PeerKind::replica && m.worker != 0) {
        throw Error(Errc::protocol,
                    fmt::format("hello from a joining replica with id {} (a replica's is 0)", m.worker));
      }
      return m;
    }
    case Kind::request: {
      Request m;
      m.worker = in.get<std::uint32_t>();
      m.tag = in.get<std::uint64_t>();
      m.computed_on = in.get<std::uint64_t>();
      return m;
    }
    case Kind::grant: {
      Grant m;
      m.sequence = in.get<std::uint64_t>();
      m.tag = in.get<std::uint64_t>();
      m.window_rkey = in.get<std::uint32_t>();
      m.token = in.get<std::uint64_t>();
      return m;
    }
    case Kind::decided: {
      Decided m;
      m.sequence = in.get<std::uint64_t>();
      m.worker = in.get<std::uint32_t>();
      m.tag = in.get<std::uint64_t>();
      return m;
    }
    case Kind::ack:
      return Ack{in.get<std::uint64_t>()};
    case Kind::bye:
      // Any id: 0 is the server's, saying to its replica that it finished (take_bye() checks
      // the id against the connection it came on).
      return Bye{in.get<std::uint32_t>()};
    case Kind::failed_over: {
      const FailedOver m{in.get<std::uint32_t>()};
      if (m.worker == 0) throw Error(Errc::protocol, "failed-over worker id 0 (ids start at 1)");
      return m;
    }
    case Kind::forwarded: {
      Forwarded m;
      m.member = in.get<std::uint64_t>();
      m.sequence = in.get<std::uint64_t>();
      const auto delivered = in.get<std::uint8_t>();
      if (delivered > 1) throw Error(Errc::protocol, fmt::format("forwarded: delivered is {} (0 or 1)", delivered));
      m.delivered = delivered == 1;
      if (m.delivered == (m.sequence == 0)) {
        throw Error(Errc::protocol, "forwarded: a delivered member names its server sequence, a lost one none");
      }
      return m;
    }
    case Kind::adopted:
      return Adopted{in.get<std::uint64_t>()};
    case Kind::listening_at: {
      ListeningAt m;
      m.kind = in.get<PeerKind>();
      if (m.kind != PeerKind::replica && m.kind != PeerKind::aggregator) {
        throw Error(Errc::protocol, fmt::format("listening-at for a peer kind {} (a replica's or an aggregator's)",
                                                static_cast<int>(m.kind)));
      }
      m.address = get_address(in, ListeningAt::kAddressBytes);
      m.port = in.get<std::uint16_t>();
      if (m.port == 0) throw Error(Errc::protocol, "a peer listening on port 0");
      return m;
    }
    case Kind::mirroring: {
      Mirroring m;
      m.worker = in.get<std::uint32_t>();
      m.from = in.get<std::uint64_t>();
      if (m.worker == 0 || m.from == 0) throw Error(Errc::protocol, "mirroring from worker 0 or sequence 0");
      return m;
    }
    case Kind::claim: {
      Claim m;
      m.sequence = in.get<std::uint64_t>();
      m.token = in.get<std::uint64_t>();
      if (m.sequence == 0) throw Error(Errc::protocol, "a claim of sequence 0");
      return m;
    }
    case Kind::replica_key: {
      ReplicaKey m;
      for (auto& b : m.key) b = in.get<std::uint8_t>();
      return m;
    }
    case Kind::opened: {
      Opened m;
      m.sequence = in.get<std::uint64_t>();
      m.window_rkey = in.get<std::uint32_t>();
      if (m.sequence == 0) throw Error(Errc::protocol, "an answer to a claim of sequence 0");
      return m;
    }
    case Kind::ask_landed: {
      const AskLanded m{in.get<std::uint32_t>()};
      if (m.worker == 0) throw Error(Errc::protocol, "ask-landed from worker id 0 (ids start at 1)");
      return m;
    }
    case Kind::landed: {
      Landed m;
      m.tag = in.get<std::uint64_t>();
      m.sequence = in.get<std::uint64_t>();
      m.computed_on = in.get<std::uint64_t>();
      if (m.sequence == 0 && (m.tag != 0 || m.computed_on != 0)) {
        throw Error(Errc::protocol, "landed: no update (sequence 0) with a tag or a version");
      }
      return m;
    }
    case Kind::refused: {
      Refused m;
      m.why = in.get<RefusedWhy>();
      if (!is_known(m.why)) {
        throw Error(Errc::protocol, fmt::format("refused for an unknown reason ({})", static_cast<int>(m.why)));
      }
      m.tag = in.get<std::uint64_t>();
      m.version = in.get<std::uint64_t>();
      return m;
    }
    case Kind::pushing: {
      Pushing m;
      m.sequence = in.get<std::uint64_t>();
      m.tag = in.get<std::uint64_t>();
      m.computed_on = in.get<std::uint64_t>();
      if (m.sequence == 0) throw Error(Errc::protocol, "pushing as sequence 0");
      return m;
    }
    case Kind::dropped: {
      const Dropped m{in.get<std::uint32_t>()};
      if (m.worker == 0) throw Error(Errc::protocol, "dropped worker id 0 (ids start at 1)");
      return m;
    }
  }
  throw Error(Errc::protocol, "unreachable message kind");
}

}  // namespace

bool take_bye(const Message& message, std::uint32_t worker, bool& said_bye) {
  const auto* bye = std::get_if<Bye>(&message);
  if (bye == nullptr) return false;
  if (bye->worker != worker) {
    throw Error(Errc::protocol, fmt::format("bye names worker {} on the connection of worker {}", bye->worker, worker));
  }
  said_bye = true;
  return true;
}

}  // namespace gradlane::ps
