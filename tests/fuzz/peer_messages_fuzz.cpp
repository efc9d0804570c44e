// Fuzz target: the sidecar-to-sidecar control messages (sidecar/peer/messages.cpp), as a
// hostile peer sidecar sends them. The input is one received message.
//
// What must hold (a violation aborts, so libFuzzer keeps the input):
//   - decode() either returns a message or throws gradlane::Error(protocol); anything else
//     (another exception type, a crash, a sanitizer report) is a bug (fuzz_util.hpp decoded());
//   - the wire format has one encoding per message, so a message that decodes re-encodes to
//     exactly the input bytes;
//   - a decoded message is within the bounds messages.hpp promises to the scheduler (sizes,
//     kinds, parts, non-negative times), restated here rather than trusted.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <variant>

#include "common/overloaded.hpp"
#include "fuzz_util.hpp"
#include "sidecar/peer/messages.hpp"

namespace gradlane::fuzz {
namespace {

constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 40;  // messages.cpp's bound, as documented

void check_bounds(const peer::Message& message) {
  std::visit(
      detail::Overloaded{
          [](const peer::Hello& m) {
            require(!m.endpoints.empty() && m.endpoints.size() <= 1024, "hello with an endpoint count out of 1..1024");
            require(m.takeovers.size() <= peer::kMaxTakeoverMarks, "hello with too many takeover marks");
            for (const peer::TakeoverMark& t : m.takeovers) require(t.epoch != 0, "hello with a takeover at epoch 0");
          },
          [](const peer::SlotRequest& m) {
            require(m.bytes != 0 && m.bytes <= kMaxBytes, "slot request size out of bounds");
            require(std::isfinite(m.gradient_norm), "slot request with a non-finite norm");
            require(m.sender != m.receiver, "slot request to itself");
          },
          [](const peer::SlotAnswer& m) {
            const auto kind = static_cast<unsigned>(m.kind);
            require(kind >= 1 && kind <= 4, "slot answer of an unknown kind");
            require(m.part_count != 0 && m.part < m.part_count, "slot answer part out of its count");
            require(m.offset <= kMaxBytes && m.length <= kMaxBytes, "slot answer offset or length out of bounds");
            require(m.start_in_ns >= 0 && m.length_ns >= 0, "slot answer with a negative slot time");
            require(m.kind == peer::AnswerKind::drop || m.transfer != 0, "slot answer without a transfer id");
            require(m.members.size() <= 65536, "aggregate with too many members");
            const bool known_cause = m.drop_cause == peer::DropCause::receiver_moved ||
                                     m.drop_cause == peer::DropCause::receiver_of_another_job ||
                                     m.drop_cause == peer::DropCause::refused ||
                                     m.drop_cause == peer::DropCause::version_from_future;
            require(m.drop_cause == peer::DropCause::stale || (known_cause && m.kind == peer::AnswerKind::drop),
                    "a drop cause that is unknown or on an answer that is not a drop");
            require(m.token == 0 || m.kind == peer::AnswerKind::go || m.kind == peer::AnswerKind::aggregate,
                    "a grant token on an answer that grants no sequence");
          },
          [](const peer::Takeover& m) { require(m.epoch != 0, "takeover at epoch 0"); },
          [](const peer::TransferDone& m) { require(m.measured_ns >= 0, "transfer done with a negative time"); },
      },
      message);
}

}  // namespace
}  // namespace gradlane::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradlane;
  using fuzz::require;
  const auto bytes = fuzz::as_bytes(data, size);
  const auto message = fuzz::decoded([&] { return peer::decode(bytes); });
  if (!message) return 0;
  fuzz::check_bounds(*message);
  const auto again = peer::encode(*message);
  require(again.size() == bytes.size() && std::equal(again.begin(), again.end(), bytes.begin()),
          "a decoded peer message does not re-encode to its bytes");
  return 0;
}
