// Page-aligned buffers, on 2 MiB hugepages when the system has free ones.
//
// Why mmap and not aligned_alloc: the mapping is ours alone (no allocator reuses the pages
// behind our back while an MR pins them), MAP_HUGETLB is available, and munmap returns the
// memory to the system at once.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <utility>

#include "common/syscall_error.hpp"
#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"

namespace gradlane {
namespace {

constexpr std::size_t kHugePage = 2u << 20;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

void* map_anonymous(std::size_t bytes, int extra_flags) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// The mapping as a shared_ptr whose deleter unmaps it: Buffers and the MemoryRegions
// registered from them share it, and the last one to go unmaps.
std::shared_ptr<void> own_mapping(void* p, std::size_t mapped) {
  // munmap only fails for arguments we never produce; nothing useful to do in a deleter.
  return std::shared_ptr<void>(p, [mapped](void* q) { (void)::munmap(q, mapped); });
}

}  // namespace

Buffer Buffer::allocate(std::size_t bytes, Pages pages) {
  if (bytes == 0) throw Error(Errc::invalid_argument, "Buffer::allocate: size must be > 0");
  // Pages::any takes hugepages only for whole ones: rdma_rxe (Debian's 6.1) refused to register
  // a hugepage mapping whose length ends mid-hugepage for remote access (ibv_reg_mr EINVAL,
  // 4,019,200 bytes remote_write|remote_read: an aggregator's ring), while whole ones register.
  const bool try_huge =
      pages == Pages::huge_only || (pages == Pages::any && bytes >= kHugePage && bytes % kHugePage == 0);
  if (try_huge) {
    const std::size_t mapped = round_up(bytes, kHugePage);
    if (void* p = map_anonymous(mapped, MAP_HUGETLB)) {
      return Buffer(own_mapping(p, mapped), bytes, mapped, true);
    }
    if (pages == Pages::huge_only) {
      detail::throw_call_failed(Errc::resource_exhausted,
                                "mmap(MAP_HUGETLB, " + std::to_string(mapped) +
                                    " bytes) — no free 2 MiB hugepages; reserve some with "
                                    "`echo N > /proc/sys/vm/nr_hugepages` or allocate with Pages::any",
                                errno);
    }
  }
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t mapped = round_up(bytes, page);
  void* p = map_anonymous(mapped, 0);
  if (p == nullptr) {
    detail::throw_call_failed(Errc::system, "mmap(" + std::to_string(mapped) + " bytes)", errno);
  }
  return Buffer(own_mapping(p, mapped), bytes, mapped, false);
}

Buffer::Buffer(Buffer&& other) noexcept
    : pages_(std::move(other.pages_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      huge_(other.huge_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    pages_ = std::move(other.pages_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    huge_ = other.huge_;
  }
  return *this;
}

Buffer::~Buffer() = default;

}  // namespace gradlane
