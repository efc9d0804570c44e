// CandidateTable: the decision order at each receiver, the deadline index, and the place a
// removal moves the last candidate into.
#include "sidecar/core/candidate_table.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

namespace gradlane::sched {
namespace {

using namespace std::chrono_literals;

Candidate part(std::uint64_t id, std::uint32_t sender, std::uint32_t receiver, Nanos duration, double norm = 0.0,
               Version deadline = kNoDeadline) {
  Candidate c;
  c.id = id;
  c.sender = sender;
  c.receiver = receiver;
  c.duration = duration;
  c.norm = norm;
  c.deadline = deadline;
  c.length = 1000;
  return c;
}

// The ids of the parts waiting at `receiver`, in decision order.
std::vector<std::uint64_t> order_at(const CandidateTable& table, std::uint32_t receiver) {
  std::vector<std::uint64_t> ids;
  for (const auto& [key, at] : table.waiting(receiver).parts) ids.push_back(table[at].id);
  return ids;
}

TEST(CandidateTable, ShortestFirstThenLargerNormThenIdUnderMlfabricAndIdOrderUnderFifo) {
  CandidateTable sjf(Ordering::mlfabric, false), fifo(Ordering::fifo, false);
  for (CandidateTable* table : {&sjf, &fifo}) {
    table->add(part(1, 10, 0, 5ms));
    table->add(part(2, 11, 0, 2ms, 0.5));
    table->add(part(3, 12, 0, 2ms, 0.9));
    table->add(part(4, 13, 0, 2ms, 0.9));
  }
  EXPECT_EQ(order_at(sjf, 0), (std::vector<std::uint64_t>{3, 4, 2, 1}));
  EXPECT_EQ(order_at(fifo, 0), (std::vector<std::uint64_t>{1, 2, 3, 4}));
}

TEST(CandidateTable, PackedOrdersByRateClassFirst) {
  CandidateTable table(Ordering::mlfabric, true);
  // 1000 bytes: in 1 us is 1e9 B/s (class 29), in 1 ms 1e6 B/s (class 19).
  const std::uint32_t fast = table.add(part(1, 10, 0, 1us));
  const std::uint32_t slow = table.add(part(2, 11, 0, 1ms));
  EXPECT_EQ(table.rate_class(table[fast]), 29);
  EXPECT_EQ(table.rate_class(table[slow]), 19);
  EXPECT_EQ(order_at(table, 0), (std::vector<std::uint64_t>{2, 1})) << "the lower class first, though longer";
  CandidateTable exclusive(Ordering::mlfabric, false);
  EXPECT_EQ(exclusive.rate_class(part(1, 10, 0, 1us)), 0);
}

TEST(CandidateTable, RemovingMovesTheLastIntoThePlaceAndKeepsEveryIndexRight) {
  CandidateTable table(Ordering::mlfabric, false);
  const std::uint32_t a = table.add(part(1, 10, 0, 1ms, 0.0, 7));
  table.add(part(2, 11, 1, 1ms, 0.0, 9));
  table.add(part(3, 12, 0, 3ms, 0.0, 5));
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table.receivers(), (std::set<std::uint32_t>{0, 1}));

  const Candidate* moved = table.remove(a);
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(moved->id, 3u) << "the last one fills the hole";
  EXPECT_EQ(table[a].id, 3u);
  EXPECT_EQ(table.waiting(0).parts.begin()->second, a) << "its index entry points at its new place";
  EXPECT_EQ(table.waiting(0).deadlines.size(), 1u);
  EXPECT_EQ(table.waiting(0).deadlines.begin()->first, (std::pair<Version, std::uint64_t>{5, 3}));
  EXPECT_EQ(table.waiting(0).deadlines.begin()->second, 12u) << "deadlines name the sender";

  ASSERT_EQ(table[1].id, 2u);
  EXPECT_EQ(table.remove(1), nullptr) << "removing the last moves nothing";
  EXPECT_EQ(table.receivers(), (std::set<std::uint32_t>{0})) << "receiver 1 has nothing waiting";
  table.remove(a);
  EXPECT_TRUE(table.receivers().empty());
  EXPECT_EQ(table.size(), 0u);
}

TEST(CandidateTable, ChangingADurationOrDeadlineReindexes) {
  CandidateTable table(Ordering::mlfabric, false);
  const std::uint32_t a = table.add(part(1, 10, 0, 1ms, 0.0, 4));
  table.add(part(2, 11, 0, 2ms, 0.0, 6));
  table.set_duration(a, 3ms);
  EXPECT_EQ(order_at(table, 0), (std::vector<std::uint64_t>{2, 1}));
  table.set_deadline(a, 8);
  EXPECT_EQ(table.waiting(0).deadlines.begin()->first.second, 2u) << "2's deadline 6 now comes first";
  EXPECT_EQ(table.waiting(0).deadlines.size(), 2u);
}

TEST(CandidateTable, AggregatesAreIndexedApartAndHaveNoDeadlineEntry) {
  CandidateTable table(Ordering::mlfabric, false);
  Candidate sum = part(40, 20, 0, 1ms, 0.0, 3);
  sum.aggregate = true;
  const std::uint32_t at = table.add(sum);
  EXPECT_EQ(table.waiting(0).aggregates.size(), 1u);
  EXPECT_TRUE(table.waiting(0).parts.empty());
  EXPECT_TRUE(table.waiting(0).deadlines.empty());
  table.replace(at, part(41, 21, 0, 1ms));
  EXPECT_TRUE(table.waiting(0).aggregates.empty());
  EXPECT_EQ(order_at(table, 0), (std::vector<std::uint64_t>{41}));
}

}  // namespace
}  // namespace gradlane::sched
