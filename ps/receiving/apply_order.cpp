#include "ps/receiving/apply_order.hpp"

#include <numeric>
#include <string>

#include "gradlane/error.hpp"

namespace gradlane::ps {

std::string_view admit_name(Admit admit) noexcept {
  switch (admit) {
    case Admit::accepted:
      return "accepted";
    case Admit::already_done:
      return "already_done";
    case Admit::beyond_window:
      return "beyond_window";
    case Admit::duplicate:
      return "duplicate";
    case Admit::slot_out_of_range:
      return "slot_out_of_range";
    case Admit::slot_busy:
      return "slot_busy";
    case Admit::already_cancelled:
      return "already_cancelled";
    case Admit::already_arrived:
      return "already_arrived";
  }
  return "unknown";
}

ApplyOrder::ApplyOrder(std::uint32_t slot_count, std::uint64_t first_sequence)
    : slot_count_(slot_count), next_(first_sequence), entries_(slot_count), slot_holder_(slot_count, kFree) {
  if (slot_count == 0) throw Error(Errc::invalid_argument, "ApplyOrder: slot_count must be at least 1");
  // 0 marks a free slot, and sequence numbers start at 1.
  if (first_sequence == 0) throw Error(Errc::invalid_argument, "ApplyOrder: sequence numbers start at 1, got 0");
}

Admit ApplyOrder::check_window(std::uint64_t sequence) const noexcept {
  if (sequence < next_) return Admit::already_done;
  // Written as a difference so a huge sequence cannot overflow next_ + slot_count_.
  if (sequence - next_ >= slot_count_) return Admit::beyond_window;
  return Admit::accepted;
}

Admit ApplyOrder::refuse(Admit reason) {
  ++refused_[static_cast<std::size_t>(reason)];
  return reason;
}

Admit ApplyOrder::would_admit(std::uint64_t sequence, std::uint32_t slot) const noexcept {
  if (const Admit window = check_window(sequence); window != Admit::accepted) return window;
  const Entry& e = entry(sequence);
  if (e.state == Entry::State::arrived) return Admit::duplicate;
  if (e.state == Entry::State::cancelled) return Admit::already_cancelled;
  if (slot >= slot_count_) return Admit::slot_out_of_range;
  if (slot_holder_[slot] != kFree) return Admit::slot_busy;
  return Admit::accepted;
}

Admit ApplyOrder::arrived(std::uint64_t sequence, std::uint32_t slot) {
  if (const Admit admit = would_admit(sequence, slot); admit != Admit::accepted) return refuse(admit);
  entry(sequence) = Entry{Entry::State::arrived, slot};
  slot_holder_[slot] = sequence;
  ++pending_;
  return Admit::accepted;
}

Admit ApplyOrder::cancelled(std::uint64_t sequence) {
  if (const Admit window = check_window(sequence); window != Admit::accepted) return refuse(window);
  Entry& e = entry(sequence);
  if (e.state == Entry::State::cancelled) return refuse(Admit::duplicate);
  if (e.state == Entry::State::arrived) return refuse(Admit::already_arrived);
  e = Entry{Entry::State::cancelled, 0};
  ++pending_;
  return Admit::accepted;
}

std::optional<Step> ApplyOrder::next() const {
  const Entry& e = entry(next_);
  switch (e.state) {
    case Entry::State::arrived:
      return Step{next_, Step::Kind::apply, e.slot};
    case Entry::State::cancelled:
      return Step{next_, Step::Kind::skip, 0};
    case Entry::State::empty:
      break;
  }
  return std::nullopt;
}

bool ApplyOrder::done(const Step& step) {
  const std::optional<Step> expected = next();
  if (!expected || !(*expected == step)) return false;
  if (step.kind == Step::Kind::apply) {
    slot_holder_[step.slot] = kFree;
    ++applied_;
  } else {
    ++skipped_;
  }
  entry(next_) = Entry{};
  --pending_;
  ++next_;
  return true;
}

std::uint64_t ApplyOrder::refused_total() const noexcept {
  return std::accumulate(refused_.begin(), refused_.end(), std::uint64_t{0});
}

std::uint64_t ApplyOrder::widen(std::uint32_t imm, std::uint64_t reference) noexcept {
  constexpr std::uint64_t kSpan = std::uint64_t{1} << 32;
  // Signed distance from the reference's low 32 bits to imm, in [-2^31, 2^31).
  const auto delta = static_cast<std::int32_t>(imm - static_cast<std::uint32_t>(reference));
  if (delta < 0 && static_cast<std::uint64_t>(-static_cast<std::int64_t>(delta)) > reference) {
    return reference + static_cast<std::uint64_t>(static_cast<std::int64_t>(delta) + static_cast<std::int64_t>(kSpan));
  }
  return reference + static_cast<std::uint64_t>(static_cast<std::int64_t>(delta));
}

}  // namespace gradlane::ps
