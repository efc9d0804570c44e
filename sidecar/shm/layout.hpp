// The shared-memory segment between gradlaned and the applications on its host: the layout
// both sides agree on. Everything here is plain data at fixed offsets — ids and offsets, never
// pointers — because the segment is mapped at a different address in every process.
//
//   Header                          magic, layout version, daemon pid + start time, generation,
//                                   geometry; daemon state; heartbeat; the daemon's doorbell
//   AppSlot[max_apps]               one per attached application:
//     claim word                    (SlotState << 32) | owner pid, changed only by CAS/store
//     owner identity + attach args  start time (defeats pid reuse), job, endpoint, region size
//     grant bell                    the futex word the application sleeps on
//     requests: Ring<AppEntry>      app -> sidecar (submit / complete)
//     grants:   Ring<GrantEntry>    sidecar -> app (go / drop / redirect / aggregate / error)
//
// The segment is created by the daemon with mode 0600 (only the daemon's user can attach) and
// unlinked when it stops. A restarted daemon creates a *new* segment under the same name with
// a new generation; applications still mapping the old one see state == stopped (clean stop)
// or a stale heartbeat / released lock (crash) and reattach by name (see sidecar.hpp).
//
// Times in this file are CLOCK_MONOTONIC nanoseconds of the host. Applications on the same
// host read the same clock (same kernel; not true across a time namespace, which gradlane
// does not support), so a grant's slot_start_ns can be compared with the application's own
// steady_clock::now() directly.
//
// Compatibility: kLayoutVersion changes with any change to this file's structs or constants;
// an application refuses a segment of another version with a message naming both. Entries
// carry their own `format` so a daemon can reject an entry it does not understand without
// trusting anything else in it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "sidecar/shm/ring.hpp"

namespace gradlane::sidecar::shm {

inline constexpr std::uint64_t kMagic = 0x31'64'65'6e'61'6c'64'67;  // "gdlaned1", little-endian
inline constexpr std::uint32_t kLayoutVersion = 6;  // 2: AppSlot::take_over; 3: Submit::job_remaining, AppSlot::slots;
                                                    // 4: AppEntry::flags kSubmitDirectOnly;
                                                    // 5: AppSlot::grant_key, GrantEntry::token (128 bytes);
                                                    // 6: Header::owners
inline constexpr std::uint16_t kEntryFormat = 1;
// 256 entries per direction (64-byte requests, 128-byte grants): 48 KiB per application.
// Deep enough that an app can submit a whole model's tensors (a few hundred) without waiting.
inline constexpr std::uint32_t kRingCapacity = 256;
inline constexpr std::uint32_t kMaxApps = 1024;  // bounds the segment at ~50 MiB

// ---- entries ----

enum class Op : std::uint8_t {
  submit = 1,              // may I send this gradient? (Submit body)
  complete = 2,            // a granted part finished (Complete body)
  complete_aggregate = 3,  // an aggregate this app forwarded finished (request = aggregate id)
  applied = 4,             // a server app: every sequence <= through is applied at the server
                           // and its replica (Applied body); opens the window B
};

// AppEntry::flags of a submit: the app cannot reach an aggregator (Update::direct_only).
inline constexpr std::uint8_t kSubmitDirectOnly = 1;

// App -> sidecar. 64 bytes: one cache line per entry.
struct AppEntry {
  std::uint16_t format;  // kEntryFormat
  Op op;
  std::uint8_t flags;     // submit: kSubmitDirectOnly or 0; other ops: 0
  std::uint32_t job;      // the job the app attached as
  std::uint64_t request;  // the app's request id (the client assigns 1, 2, 3, ...)
  struct Submit {
    std::uint32_t tensor;
    std::uint32_t receiver;       // endpoint id of the server holding the shard
    std::uint64_t bytes;          // gradient bytes
    std::uint64_t region_offset;  // where they start in the app's registered gradient region
    std::uint64_t computed_on;    // server model version the gradient was computed on
    float gradient_norm;
    std::uint32_t priority;       // lower = earlier layer = needed first
    std::uint64_t job_remaining;  // bytes the job still has to send, this one included; 0 = unknown
  };
  struct Complete {
    std::uint32_t part;         // part index of the grant being completed
    std::uint32_t failed;       // 0 = placed, 1 = the transfer failed
    std::uint64_t measured_ns;  // wire time, post to completion
    std::uint64_t reserved[4];  // must be 0
  };
  struct Applied {
    std::uint32_t receiver;     // the server's endpoint: the one the app attached as
    std::uint32_t reserved0;    // must be 0
    std::uint64_t through;      // every sequence <= through is applied (server and replica)
    std::uint64_t reserved[4];  // must be 0
  };
  union {
    Submit submit;
    Complete complete;
    Applied applied;
  } body;
};

enum class GrantKind : std::uint8_t { go = 1, drop = 2, redirect = 3, aggregate = 4, error = 5, cancel = 6 };

// Sidecar -> app. 128 bytes (two lines: the token did not fit one). Field meaning per kind is
// documented on gradlane::sidecar::Grant.
struct GrantEntry {
  std::uint16_t format;
  GrantKind kind;
  std::uint8_t reason;         // gradlane::sidecar::Reason
  std::uint32_t target;        // go: server endpoint; redirect: aggregator; aggregate: server
  std::uint64_t request;       // the app's request id (aggregate: the aggregate id)
  std::uint64_t sequence;      // go/aggregate: sequence at the server; redirect: aggregate id
  std::int64_t slot_start_ns;  // CLOCK_MONOTONIC of this host
  std::int64_t slot_length_ns;
  std::uint64_t part_offset;  // bytes [offset, offset + part_bytes) of the tensor
  std::uint64_t part_bytes;
  std::uint32_t part_index;
  std::uint32_t part_count;  // aggregate: number of members
  // go/aggregate to a receiver whose server app gave a grant key: grant_token(key, sequence),
  // the grantee's proof to the server (sidecar.hpp). 0: none.
  std::uint64_t token;
  std::uint64_t reserved[7];  // 0
};

static_assert(sizeof(AppEntry) == 64 && std::is_trivially_copyable_v<AppEntry>);
static_assert(sizeof(GrantEntry) == 128 && std::is_trivially_copyable_v<GrantEntry>);

// ---- header ----

enum class DaemonState : std::uint32_t { starting = 0, running = 1, stopped = 2 };

// One entry of the owners book (owner_book.hpp): `endpoint`'s server is an app of `job`.
struct OwnedEndpoint {
  std::atomic<std::uint64_t> endpoint_plus_one;  // 0: an empty entry; written last
  std::uint32_t job;
  std::uint32_t reserved;
};
// Receiver endpoints a daemon serves at most: more than any host has NICs and replicas.
inline constexpr std::uint32_t kOwnerBookEntries = 256;

struct Header {
  // Line 0: identity and geometry, written once before `magic` is published (release), so an
  // opener that sees the magic sees all of it.
  alignas(kCacheLine) std::atomic<std::uint64_t> magic;
  std::uint32_t layout_version;
  std::uint32_t max_apps;
  std::uint32_t ring_capacity;
  std::uint32_t daemon_pid;
  std::uint64_t daemon_start_time;  // /proc/<pid>/stat starttime, to name the daemon in errors
  std::uint64_t generation;         // random per daemon start: a reattach can tell it is new
  std::uint64_t segment_bytes;
  std::uint64_t max_update_bytes;  // what the daemon accepts (informational for apps)
  // Line 1: read by applications on every call, written only at start and stop.
  alignas(kCacheLine) std::atomic<std::uint32_t> state;
  // Line 2: written every heartbeat interval; read only when an application waits or fails.
  alignas(kCacheLine) std::atomic<std::int64_t> heartbeat_ns;
  // Line 3: the daemon's wake-up (an eventcount on a futex word, see futex.hpp).
  alignas(kCacheLine) std::atomic<std::uint32_t> doorbell;
  std::atomic<std::uint32_t> daemon_sleeping;
  // Bumped by an app on attach/detach so the daemon scans the claim words only when needed.
  alignas(kCacheLine) std::atomic<std::uint32_t> attach_epoch;
  // Lines 5 on: which job each receiver endpoint belongs to, written by the daemon alone and
  // read by its successor (owner_book.hpp). Kept in the shared segment only.
  alignas(kCacheLine) OwnedEndpoint owners[kOwnerBookEntries];
};

// ---- application slots ----

enum class SlotState : std::uint32_t {
  free = 0,
  claiming = 1,   // an app won the CAS and is filling in its identity
  attaching = 2,  // identity written; waiting for the daemon to accept
  active = 3,     // the daemon serves it
  detaching = 4,  // the app left; the daemon will reclaim
  rejected = 5,   // the daemon refused the attach (reason in `reason`); the app frees it
  evicted = 6,    // the daemon stopped serving a misbehaving app (reason in `reason`)
};

constexpr std::uint64_t claim_word(SlotState state, std::uint32_t pid) noexcept {
  return (static_cast<std::uint64_t>(state) << 32) | pid;
}
constexpr SlotState claim_state(std::uint64_t word) noexcept { return static_cast<SlotState>(word >> 32); }
constexpr std::uint32_t claim_pid(std::uint64_t word) noexcept { return static_cast<std::uint32_t>(word); }

using RequestRing = Ring<AppEntry, kRingCapacity>;
using GrantRing = Ring<GrantEntry, kRingCapacity>;

struct AppSlot {
  // Line 0: ownership. State and pid in one word so a claim is one CAS and a slot in any
  // non-free state always names a process the daemon can check for liveness.
  alignas(kCacheLine) std::atomic<std::uint64_t> claim;
  std::atomic<std::uint32_t> reason;  // why rejected / evicted (Reason), written before state
  std::uint32_t job;
  std::uint64_t owner_start_time;  // /proc/<pid>/stat starttime of the owner
  std::uint64_t region_bytes;      // size of the app's gradient region (offsets are checked)
  std::uint32_t endpoint;          // the NIC (sched EndpointId) the app sends from
  std::uint32_t slots;             // a server app: AttachOptions::slots (0: none)
  // 0: a plain attach. Else 1 + the version at which a promoted replica takes over `endpoint`'s
  // sequence (AttachOptions::take_over_at): the daemon hands it out from version + 1 on.
  std::uint64_t take_over;
  // A server app: AttachOptions::grant_key (all zero: none). The daemon stamps its receiver's
  // grants with tokens of this key. Readable by the apps of this segment: the key keeps a
  // worker on another host to its own slots, not a process that can read the server's memory.
  std::uint8_t grant_key[16];
  // Line 1: the app's wake-up, written by the daemon only while the app sleeps.
  alignas(kCacheLine) std::atomic<std::uint32_t> grant_bell;
  std::atomic<std::uint32_t> app_sleeping;
  RequestRing requests;
  GrantRing grants;
};

static_assert(std::is_standard_layout_v<Header> && std::is_standard_layout_v<AppSlot>);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

constexpr std::size_t header_bytes() noexcept { return (sizeof(Header) + kCacheLine - 1) / kCacheLine * kCacheLine; }
constexpr std::size_t segment_bytes(std::uint32_t max_apps) noexcept {
  return header_bytes() + std::size_t{max_apps} * sizeof(AppSlot);
}

// Typed views into a mapped segment (the mapping is always page-aligned).
inline Header* header_at(void* base) noexcept { return static_cast<Header*>(base); }
inline AppSlot* slot_at(void* base, std::uint32_t index) noexcept {
  return reinterpret_cast<AppSlot*>(static_cast<std::byte*>(base) + header_bytes()) + index;
}

}  // namespace gradlane::sidecar::shm
