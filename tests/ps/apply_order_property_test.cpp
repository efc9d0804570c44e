// ApplyOrder against an independent model, over thousands of seeded random runs: a sender
// that delivers arrivals and cancels in random order within the window (as the network and
// dying workers would), interleaved with replays and forged doorbells and with the receiver
// applying whatever is ready. The model is a std::map of what was accepted and a map of held
// slots; it predicts every verdict. Afterwards: sequences were done strictly +1 at a time,
// each exactly once, applied exactly when an arrival (not a cancel) was accepted, from its slot.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "ps/receiving/apply_order.hpp"

namespace gradlane::ps {
namespace {

struct Sent {
  bool cancel = false;
  std::uint32_t slot = 0;
};

// The model: deliberately naive (maps, linear scans), sharing no code with ApplyOrder.
struct Model {
  std::uint32_t slots;
  std::uint64_t next;
  std::map<std::uint64_t, Sent> accepted;       // every accepted event, done or not
  std::map<std::uint32_t, std::uint64_t> held;  // slot → pending arrival in it

  Admit predict(std::uint64_t seq, bool cancel, std::uint32_t slot) const {
    if (seq < next) return Admit::already_done;
    if (seq >= next + slots) return Admit::beyond_window;
    if (const auto it = accepted.find(seq); it != accepted.end()) {
      if (it->second.cancel == cancel) return Admit::duplicate;
      return cancel ? Admit::already_arrived : Admit::already_cancelled;
    }
    if (cancel) return Admit::accepted;
    if (slot >= slots) return Admit::slot_out_of_range;
    if (held.count(slot) != 0) return Admit::slot_busy;
    return Admit::accepted;
  }
  void record(std::uint64_t seq, bool cancel, std::uint32_t slot) {
    accepted[seq] = Sent{cancel, slot};
    if (!cancel) held[slot] = seq;
  }
  std::size_t pending() const {
    return static_cast<std::size_t>(std::distance(accepted.lower_bound(next), accepted.end()));
  }
};

class Delivery {
 public:
  explicit Delivery(std::uint32_t seed)
      : rng_(seed),
        slots_(pick(1, 16)),
        first_(pick(1, 3) == 1 ? (std::uint64_t{1} << 32) - pick(0, 20) : pick(1, 1000)),
        total_(pick(1, 120)),
        order_(slots_, first_),
        model_{slots_, first_, {}, {}} {
    for (std::uint64_t i = 0; i < total_; ++i) cancel_plan_.push_back(pick(1, 5) == 1);
  }

  void play() {
    std::uint64_t unsent_lo = first_;  // every sequence below was accepted
    while (model_.next < first_ + total_) {
      const std::uint64_t roll = pick(0, 99);
      if (roll < 30) {
        apply_next();
      } else if (roll < 45) {
        forge();
      } else {
        // A legitimate event for a random unsent sequence inside the window.
        while (unsent_lo < first_ + total_ && model_.accepted.count(unsent_lo) != 0) ++unsent_lo;
        std::vector<std::uint64_t> sendable;
        for (std::uint64_t s = unsent_lo; s < std::min(model_.next + slots_, first_ + total_); ++s) {
          if (model_.accepted.count(s) == 0) sendable.push_back(s);
        }
        if (sendable.empty()) {
          apply_next();
        } else {
          const std::uint64_t s = sendable[pick(0, sendable.size() - 1)];
          // The sidecar only hands out a free slot, and an unsent sequence in the window
          // always has one: so this must be accepted.
          EXPECT_EQ(deliver(s, cancel_plan_[s - first_], free_slot()), Admit::accepted);
        }
      }
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_EQ(order_.next_sequence(), first_ + total_);
    EXPECT_EQ(order_.pending(), 0u);
    EXPECT_EQ(order_.applied() + order_.skipped(), total_);
    EXPECT_EQ(order_.skipped(), static_cast<std::uint64_t>(std::count(cancel_plan_.begin(), cancel_plan_.end(), true)));
    EXPECT_EQ(done_.size(), total_);
    EXPECT_EQ(order_.refused_total(), forged_);  // every legitimate event was accepted
  }

 private:
  std::uint64_t pick(std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng_);
  }

  std::uint32_t free_slot() {
    std::vector<std::uint32_t> free;
    for (std::uint32_t s = 0; s < slots_; ++s) {
      if (model_.held.count(s) == 0) free.push_back(s);
    }
    return free.empty() ? 0 : free[pick(0, free.size() - 1)];  // none free: refused as busy
  }

  Admit deliver(std::uint64_t seq, bool cancel, std::uint32_t slot) {
    const Admit expected = model_.predict(seq, cancel, slot);
    const Admit got = cancel ? order_.cancelled(seq) : order_.arrived(seq, slot);
    EXPECT_EQ(got, expected) << "seq " << seq << (cancel ? " cancel" : " arrival") << " slot " << slot;
    if (got == Admit::accepted) model_.record(seq, cancel, slot);
    EXPECT_EQ(order_.pending(), model_.pending());
    return got;
  }

  // Replays, contradictions, far-off sequences, bad slots: whatever the model says, it must match.
  void forge() {
    const std::uint64_t lo = model_.next > first_ + 3 ? model_.next - 3 : first_;
    const std::uint64_t seq = pick(0, 9) == 0 ? pick(0, ~std::uint64_t{0}) : pick(lo, model_.next + slots_ + 3);
    const auto slot = static_cast<std::uint32_t>(pick(0, slots_));
    const bool cancel = pick(0, 1) == 1;
    // A forgery the receiver would accept is indistinguishable from the real thing (it would
    // change what "was sent"), so only forgeries the model says must be refused are sent.
    if (model_.predict(seq, cancel, slot) == Admit::accepted) return;
    ++forged_;
    deliver(seq, cancel, slot);
  }

  void apply_next() {
    const std::optional<Step> step = order_.next();
    const auto it = model_.accepted.find(model_.next);
    ASSERT_EQ(step.has_value(), it != model_.accepted.end()) << "at " << model_.next;
    if (!step) return;
    ASSERT_EQ(step->sequence, model_.next);
    ASSERT_EQ(step->kind == Step::Kind::skip, it->second.cancel);
    if (!it->second.cancel) {
      ASSERT_EQ(step->slot, it->second.slot);
    }
    ASSERT_EQ(order_.next(), step);  // a peek
    ASSERT_FALSE(order_.done(Step{step->sequence + 1, step->kind, step->slot}));
    ASSERT_TRUE(order_.done(*step));
    if (!done_.empty()) {
      ASSERT_EQ(step->sequence, done_.back() + 1);
    }
    done_.push_back(step->sequence);
    if (!it->second.cancel) model_.held.erase(it->second.slot);
    ++model_.next;
  }

  std::mt19937_64 rng_;
  std::uint32_t slots_;
  std::uint64_t first_;
  std::uint64_t total_;
  std::vector<bool> cancel_plan_;
  ApplyOrder order_;
  Model model_;
  std::vector<std::uint64_t> done_;
  std::uint64_t forged_ = 0;
};

TEST(ApplyOrderProperty, MatchesTheModelOverRandomDeliveries) {
  for (std::uint32_t seed = 1; seed <= 5000; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Delivery(seed).play();
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace gradlane::ps
