// A single-producer / single-consumer ring of plain-data entries that lives in shared memory.
//
// Why not boost::lockfree::spsc_queue<Entry, capacity<K>>: in Boost 1.74 (Debian 12) the
// compile-time-sized queue *is* placement-constructible in shared memory — it is two
// std::atomic<size_t> indices (lock-free, hence address-free) and an aligned_storage array,
// no pointer and no vtable. What rules it out is trust: both of its indices live in the
// shared segment and each side reads its own index back from there. An application bug (or a
// hostile one) that scribbles over `read_index_` makes the daemon index
// `buffer[read_index]` out of bounds, and one app could then crash the sidecar that every
// other app on the host depends on. This ring keeps each side's authoritative index in its own
// process memory (RingWriter::tail_, RingReader::head_), only *publishes* it to shared memory,
// masks every slot index, and checks the peer's published index for plausibility, so a
// corrupted ring is reported (Status::corrupt) instead of followed. The per-side caches of the
// peer's index also mean a push or pop touches the peer's cache line only when the ring looks
// full / empty, which is what keeps the hop cheap (see perf/sidecar: it is measured against an
// in-process boost::lockfree::spsc_queue).
//
// Indices are free-running 64-bit counters (never wrap in practice: 2^64 entries), so full
// and empty are distinguishable without a sacrificed slot and a stale index cannot alias.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace gradlane::sidecar::shm {

inline constexpr std::size_t kCacheLine = 64;

template <class Entry, std::uint32_t Capacity>
struct Ring {
  static_assert(std::is_trivially_copyable_v<Entry>, "ring entries cross processes: plain data only");
  static_assert(Capacity > 0 && (Capacity & (Capacity - 1)) == 0, "capacity must be a power of two");
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
                "a lock-free atomic is address-free, which is what makes it usable across processes");
  static constexpr std::uint32_t capacity = Capacity;

  // Separate cache lines: the producer writes `tail`, the consumer writes `head`.
  alignas(kCacheLine) std::atomic<std::uint64_t> tail{0};  // entries published so far
  alignas(kCacheLine) std::atomic<std::uint64_t> head{0};  // entries consumed so far
  alignas(kCacheLine) Entry slots[Capacity];

  // Only while nobody reads or writes the ring (the daemon resets a slot before freeing it).
  void reset() noexcept {
    tail.store(0, std::memory_order_relaxed);
    head.store(0, std::memory_order_relaxed);
  }
};

enum class RingStatus : std::uint8_t { ok, empty, full, corrupt };

// The producer's side. Not copyable across processes: it is per-process state.
template <class Entry, std::uint32_t Capacity>
class RingWriter {
 public:
  using RingType = Ring<Entry, Capacity>;
  RingWriter() = default;
  explicit RingWriter(RingType* ring) noexcept : ring_(ring) {}

  RingStatus push(const Entry& entry) noexcept {
    if (tail_ - head_seen_ >= Capacity) {
      const std::uint64_t head = ring_->head.load(std::memory_order_acquire);
      // The consumer can neither have read what was never written nor fall more than a ring
      // behind: anything else is a corrupted (or hostile) index.
      if (head > tail_ || tail_ - head > Capacity) return RingStatus::corrupt;
      head_seen_ = head;
      if (tail_ - head_seen_ >= Capacity) return RingStatus::full;
    }
    ring_->slots[tail_ & (Capacity - 1)] = entry;
    ++tail_;
    ring_->tail.store(tail_, std::memory_order_release);
    return RingStatus::ok;
  }

  // Entries pushed and not yet seen consumed (refreshes the view of the consumer's index).
  std::uint64_t backlog() noexcept {
    const std::uint64_t head = ring_->head.load(std::memory_order_acquire);
    if (head <= tail_ && tail_ - head <= Capacity) head_seen_ = head;
    return tail_ - head_seen_;
  }

 private:
  RingType* ring_ = nullptr;
  std::uint64_t tail_ = 0;
  std::uint64_t head_seen_ = 0;
};

// The consumer's side.
template <class Entry, std::uint32_t Capacity>
class RingReader {
 public:
  using RingType = Ring<Entry, Capacity>;
  RingReader() = default;
  explicit RingReader(RingType* ring) noexcept : ring_(ring) {}

  // Copies the next entry out (the copy is what gets validated: the producer cannot change it
  // afterwards) and releases its slot.
  RingStatus pop(Entry& out) noexcept {
    if (head_ == tail_seen_) {
      const RingStatus status = refresh();
      if (status != RingStatus::ok) return status;
    }
    out = ring_->slots[head_ & (Capacity - 1)];
    ++head_;
    ring_->head.store(head_, std::memory_order_release);
    return RingStatus::ok;
  }

  // Whether an entry is waiting (one acquire load when the cached view says empty).
  bool ready() noexcept { return head_ != tail_seen_ || refresh() == RingStatus::ok; }

 private:
  RingStatus refresh() noexcept {
    const std::uint64_t tail = ring_->tail.load(std::memory_order_acquire);
    if (tail == head_) return RingStatus::empty;
    if (tail < head_ || tail - head_ > Capacity) return RingStatus::corrupt;
    tail_seen_ = tail;
    return RingStatus::ok;
  }

  RingType* ring_ = nullptr;
  std::uint64_t head_ = 0;
  std::uint64_t tail_seen_ = 0;
};

}  // namespace gradlane::sidecar::shm
