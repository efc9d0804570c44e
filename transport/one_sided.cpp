// One-sided operations: RDMA WRITE, WRITE_WITH_IMM, a write and its doorbell, READ — each
// checked against both regions before anything is posted, and split into work requests of at
// most the port's max_msg_sz.
#include <arpa/inet.h>

#include <fmt/format.h>

#include "gradlane/connection.hpp"
#include "transport/connection_state.hpp"
#include "transport/wire.hpp"

namespace gradlane {

namespace {

// Zero bytes are refused except for a doorbell (WRITE_WITH_IMM), where the immediate is the point.
enum class Empty { refused, allowed };

void check_slices(const char* op, const detail::ConnectionState& s, const MemoryRegion& local, std::size_t local_offset,
                  const RegionDescriptor& remote, std::uint64_t remote_offset, std::size_t length,
                  Empty empty = Empty::refused) {
  if (length == 0 && empty == Empty::refused) throw Error(Errc::invalid_argument, fmt::format("{} of 0 bytes", op));
  (void)s;
  if (!local.contains(local_offset, length)) {
    throw Error(Errc::out_of_range, fmt::format("{} of {} bytes at local offset {} exceeds the local region ({} bytes)",
                                                op, length, local_offset, local.length()));
  }
  if (!remote.contains(remote_offset, length)) {
    throw Error(Errc::out_of_range,
                fmt::format("{} of {} bytes at remote offset {} exceeds the remote region ({} bytes at {:#x}, rkey "
                            "{:#x}); nothing was sent",
                            op, length, remote_offset, remote.length, remote.addr, remote.rkey));
  }
}

}  // namespace

namespace {

ibv_send_wr one_sided(ibv_wr_opcode opcode, ibv_sge& sge, const MemoryRegion& local, std::size_t local_offset,
                      const RegionDescriptor& remote, std::uint64_t remote_offset, std::size_t length,
                      std::uint32_t max_inline) {
  sge.addr = reinterpret_cast<std::uintptr_t>(local.data()) + local_offset;
  sge.length = static_cast<std::uint32_t>(length);
  sge.lkey = local.lkey();
  ibv_send_wr wr{};
  wr.opcode = opcode;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = remote.addr + remote_offset;
  wr.wr.rdma.rkey = remote.rkey;
  // Inline: the driver copies the payload into the WQE, sparing the NIC a DMA read of it.
  if (opcode != IBV_WR_RDMA_READ && length <= max_inline) wr.send_flags = IBV_SEND_INLINE;
  return wr;
}

}  // namespace

namespace {

// A one-sided operation longer than the port's max_msg_sz (8 MiB on rxe; a work request's length
// is 32 bits anyway) goes as several work requests of at most that size. All but the last are
// posted here, unsignalled unless the signal interval says so; the caller posts the last one,
// `last_length` bytes at the returned offset, whose completion follows every earlier one on the
// RC queue pair. Returns that offset from the start of the operation.
std::uint64_t post_all_but_last(detail::ConnectionState& s, ibv_wr_opcode opcode, const MemoryRegion& local,
                                std::size_t local_offset, const RegionDescriptor& remote, std::uint64_t remote_offset,
                                std::size_t length, std::size_t& last_length) {
  const std::vector<detail::MessageSpan> spans = detail::split_into_messages(length, s.device.info().max_message_bytes);
  for (std::size_t i = 0; i + 1 < spans.size(); ++i) {
    ibv_sge sge{};
    auto wr = one_sided(opcode, sge, local, local_offset + spans[i].offset, remote, remote_offset + spans[i].offset,
                        spans[i].length, s.options.max_inline);
    s.post(wr, {opcode, spans[i].length, wr.wr.rdma.remote_addr, remote.rkey}, false);
  }
  last_length = spans.back().length;
  return spans.back().offset;
}

}  // namespace

OpId Connection::write(const MemoryRegion& src, std::size_t src_offset, const RegionDescriptor& dst,
                       std::uint64_t dst_offset, std::size_t length, Signal signal) {
  check_slices("RDMA WRITE", *state_, src, src_offset, dst, dst_offset, length);
  std::size_t n = 0;
  const auto at = post_all_but_last(*state_, IBV_WR_RDMA_WRITE, src, src_offset, dst, dst_offset, length, n);
  ibv_sge sge{};
  auto wr =
      one_sided(IBV_WR_RDMA_WRITE, sge, src, src_offset + at, dst, dst_offset + at, n, state_->options.max_inline);
  return state_->post(wr, {IBV_WR_RDMA_WRITE, n, wr.wr.rdma.remote_addr, dst.rkey}, signal == Signal::always);
}

OpId Connection::write_with_imm(const MemoryRegion& src, std::size_t src_offset, const RegionDescriptor& dst,
                                std::uint64_t dst_offset, std::size_t length, std::uint32_t imm, Signal signal) {
  check_slices("RDMA WRITE_WITH_IMM", *state_, src, src_offset, dst, dst_offset, length, Empty::allowed);
  std::size_t n = 0;
  const auto at = post_all_but_last(*state_, IBV_WR_RDMA_WRITE, src, src_offset, dst, dst_offset, length, n);
  ibv_sge sge{};
  auto wr = one_sided(IBV_WR_RDMA_WRITE_WITH_IMM, sge, src, src_offset + at, dst, dst_offset + at, n,
                      state_->options.max_inline);
  wr.imm_data = htonl(imm);
  return state_->post(wr, {IBV_WR_RDMA_WRITE_WITH_IMM, n, wr.wr.rdma.remote_addr, dst.rkey}, signal == Signal::always);
}

OpId Connection::write_and_ring(const MemoryRegion& src, std::size_t src_offset, const RegionDescriptor& dst,
                                std::uint64_t dst_offset, std::size_t whole_length, std::uint32_t imm) {
  check_slices("RDMA WRITE", *state_, src, src_offset, dst, dst_offset, whole_length);
  std::size_t length = 0;
  const auto at = post_all_but_last(*state_, IBV_WR_RDMA_WRITE, src, src_offset, dst, dst_offset, whole_length, length);
  src_offset += at;
  dst_offset += at;
  ibv_sge payload_sge{};
  auto payload =
      one_sided(IBV_WR_RDMA_WRITE, payload_sge, src, src_offset, dst, dst_offset, length, state_->options.max_inline);
  // The doorbell carries no bytes (num_sge 0): only the immediate, placed after the payload
  // by RC ordering. Its address is the payload's end, inside the region the rkey covers.
  ibv_send_wr doorbell{};
  doorbell.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  doorbell.wr.rdma.remote_addr = dst.addr + dst_offset + length;
  doorbell.wr.rdma.rkey = dst.rkey;
  doorbell.imm_data = htonl(imm);
  return state_->post_pair(payload, {IBV_WR_RDMA_WRITE, length, payload.wr.rdma.remote_addr, dst.rkey}, doorbell,
                           {IBV_WR_RDMA_WRITE_WITH_IMM, 0, doorbell.wr.rdma.remote_addr, dst.rkey});
}

OpId Connection::read(const MemoryRegion& dst, std::size_t dst_offset, const RegionDescriptor& src,
                      std::uint64_t src_offset, std::size_t length) {
  check_slices("RDMA READ", *state_, dst, dst_offset, src, src_offset, length);
  if (!has(dst.access(), Access::local_write) && !has(dst.access(), Access::remote_write)) {
    throw Error(Errc::invalid_argument,
                "RDMA READ destination region was registered without local_write access; the NIC cannot write it");
  }
  std::size_t n = 0;
  const auto at = post_all_but_last(*state_, IBV_WR_RDMA_READ, dst, dst_offset, src, src_offset, length, n);
  ibv_sge sge{};
  auto wr = one_sided(IBV_WR_RDMA_READ, sge, dst, dst_offset + at, src, src_offset + at, n, 0);
  return state_->post(wr, {IBV_WR_RDMA_READ, n, wr.wr.rdma.remote_addr, src.rkey}, true);
}

}  // namespace gradlane
