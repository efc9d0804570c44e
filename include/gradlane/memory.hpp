// gradlane — buffers and memory registration.
//
// Gradient buffers live in page-aligned memory (2 MiB hugepages when the system has them) and
// are registered once with the access rights they need and no more: a buffer that is only
// written into remotely gets REMOTE_WRITE, not REMOTE_READ. A RegionDescriptor (addr, rkey,
// length) is what a peer needs to access a region; it is exchanged once per (region, peer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "gradlane/device.hpp"

struct ibv_mr;

namespace gradlane {

// ---- page-aligned buffers ------------------------------------------------------------------

class Buffer {
 public:
  enum class Pages { any, huge_only, small_only };
  // Allocates `bytes` rounded up to whole pages. With Pages::any, whole multiples of 2 MiB try
  // MAP_HUGETLB first and fall back to 4 KiB pages when no hugepage is free.
  static Buffer allocate(std::size_t bytes, Pages pages = Pages::any);

  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  // Releases this handle on the pages. They are unmapped once no MemoryRegion registered
  // through register_buffer() pins them any more, so a registration never outlives its memory.
  ~Buffer();

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }           // requested size
  std::size_t mapped_size() const { return mapped_; }  // whole pages
  bool on_hugepages() const { return huge_; }
  std::span<std::byte> bytes() const { return {data_, size_}; }

 private:
  friend class MemoryRegion;  // pins `pages_` for the lifetime of a registration
  Buffer(std::shared_ptr<void> pages, std::size_t size, std::size_t mapped, bool huge)
      : pages_(std::move(pages)),
        data_(static_cast<std::byte*>(pages_.get())),
        size_(size),
        mapped_(mapped),
        huge_(huge) {}
  std::shared_ptr<void> pages_;  // the mapping; its deleter munmaps
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
  bool huge_ = false;
};

// ---- access rights -------------------------------------------------------------------------

enum class Access : unsigned {
  local = 0,               // used only as a local source (the NIC reads it for WRITE/SEND)
  local_write = 1u << 0,   // the NIC writes it locally (READ destination, RECV buffer)
  remote_write = 1u << 1,  // peers RDMA WRITE into it (implies local_write, as verbs requires)
  remote_read = 1u << 2,   // peers RDMA READ from it
  // Memory windows may be bound over it (IBV_ACCESS_MW_BIND). A region registered with
  // windows but without remote_write/remote_read cannot be reached through its own rkey at
  // all: peers get only windows, each over the slice it was granted (see MemoryWindow).
  windows = 1u << 3,
};
constexpr Access operator|(Access a, Access b) {
  return static_cast<Access>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
constexpr bool has(Access set, Access bit) { return (static_cast<unsigned>(set) & static_cast<unsigned>(bit)) != 0; }
// The ibv_access_flags for `access` (REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE).
int to_ibv_access(Access access);

// ---- region descriptors --------------------------------------------------------------------

// What a peer needs to address a registered region: plain data, fixed 20-byte little-endian
// wire format so it can travel in a control message.
struct RegionDescriptor {
  std::uint64_t addr = 0;
  std::uint64_t length = 0;
  std::uint32_t rkey = 0;

  static constexpr std::size_t kWireSize = 20;
  void encode(std::span<std::byte, kWireSize> out) const;
  static RegionDescriptor decode(std::span<const std::byte, kWireSize> in);
  // True when [offset, offset+len) lies inside the region (overflow-safe).
  bool contains(std::uint64_t offset, std::uint64_t len) const { return offset <= length && len <= length - offset; }
  bool operator==(const RegionDescriptor&) const = default;
};

// ---- memory regions ------------------------------------------------------------------------

// A registered memory region (RAII over ibv_mr). Keeps its Device alive, and — when made by
// register_buffer() — its Buffer's pages: destroying or reassigning the Buffer while the
// region lives does not unmap them (the NIC could otherwise write into memory the process
// reuses), they go when the region does.
class MemoryRegion {
 public:
  // Registers [addr, addr+length) with exactly `access`. Throws Error(memlock_too_low) with
  // what to raise when pinning fails for lack of RLIMIT_MEMLOCK, Error(registration_failed)
  // otherwise. The caller keeps that memory mapped while the region lives (the library cannot
  // see foreign memory go); prefer register_buffer(), which makes this automatic.
  static MemoryRegion register_memory(const Device& device, void* addr, std::size_t length, Access access);
  // Registers the whole buffer and pins its pages for the region's lifetime.
  static MemoryRegion register_buffer(const Device& device, const Buffer& buffer, Access access);
  // Registers buffer[offset, offset+length) as a region of its own, pinning the buffer's pages:
  // e.g. one region per slot of a ring, so that the NIC bounds every access to one slot (what
  // confines a memory window to its slot on rdma_rxe). Error(out_of_range) when it does not fit.
  static MemoryRegion register_slice(const Device& device, const Buffer& buffer, std::size_t offset, std::size_t length,
                                     Access access);

  MemoryRegion(MemoryRegion&&) noexcept = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  // Releases the old MR before the device it belongs to (a PD cannot go while MRs use it). A
  // memory window bound over the old MR keeps it registered until the window goes.
  MemoryRegion& operator=(MemoryRegion&& other) noexcept {
    mr_ = std::move(other.mr_);
    pages_ = std::move(other.pages_);  // after the old MR is gone: never unmap under an MR
    device_ = std::move(other.device_);
    access_ = other.access_;
    return *this;
  }
  ~MemoryRegion();

  std::byte* data() const;
  std::size_t length() const;
  std::uint32_t lkey() const;
  std::uint32_t rkey() const;
  Access access() const { return access_; }
  RegionDescriptor descriptor() const { return {reinterpret_cast<std::uintptr_t>(data()), length(), rkey()}; }
  // True when [offset, offset+len) lies inside the region (overflow-safe).
  bool contains(std::size_t offset, std::size_t len) const { return offset <= length() && len <= length() - offset; }

 private:
  // Binding a window needs the ibv_mr, and the window shares it (and the pages): the MR stays
  // registered while a window is bound over it (verbs refuses to deregister it before).
  friend class Connection;
  MemoryRegion(Device device, std::shared_ptr<ibv_mr> mr, Access access)
      : device_(std::move(device)), mr_(std::move(mr)), access_(access) {}
  Device device_;                // declared first: destroyed after mr_, so the PD outlives the MR
  std::shared_ptr<void> pages_;  // a Buffer's pages (register_buffer), unmapped after mr_ goes
  std::shared_ptr<ibv_mr> mr_;   // deregistered by its deleter once no window shares it
  Access access_;
};

// ---- RLIMIT_MEMLOCK ------------------------------------------------------------------------

// Pure verdict: given the soft memlock limit (bytes, nullopt = unlimited), whether the process
// has CAP_IPC_LOCK (which lifts the limit) and the bytes it wants pinned, returns the
// actionable message when pinning would fail, nullopt when it is fine.
std::optional<std::string> memlock_problem(std::optional<std::uint64_t> limit_bytes, bool has_cap_ipc_lock,
                                           std::uint64_t bytes_to_pin);
// Reads RLIMIT_MEMLOCK and CAP_IPC_LOCK of this process and throws Error(memlock_too_low)
// with that message when `bytes_to_pin` cannot be pinned. Call it at start-up with the total
// size of the buffers the job will register.
void check_memlock(std::uint64_t bytes_to_pin);

}  // namespace gradlane
