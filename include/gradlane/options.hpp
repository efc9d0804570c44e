// gradlane — transport knobs.
//
// Every tunable is declared here once, with its default and the environment variable that
// overrides it (NCCL-style: grep the variable name and you find the knob and its effect).
// Programs may also set fields directly; `TransportOptions::from_env()` starts from the
// defaults and applies GRADLANE_* variables, rejecting malformed values with an Error that
// names the variable.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "gradlane/error.hpp"

namespace gradlane {

// The longest job key the connect handshake carries (TransportOptions::job_key).
inline constexpr std::size_t kMaxJobKeyBytes = 32;

struct TransportOptions {
  // GRADLANE_ACK_TIMEOUT: local ACK timeout exponent, 4.096 µs × 2^n (IB spec). 18 ≈ 1.07 s.
  // Smaller detects a dead peer sooner, but rxe under qemu/TCG retransmits spuriously below
  // ~17, and a congested RoCE fabric needs headroom too.
  std::uint8_t ack_timeout = 18;
  // GRADLANE_RETRY_COUNT: transport retries after an ACK timeout before the QP fails with
  // IBV_WC_RETRY_EXC_ERR. With ack_timeout 18, 1 retry bounds silent-peer detection to ~2 s
  // (NCCL's 20/7 takes ~30 s). A peer that exits cleanly or is killed is seen sooner, via the
  // rdma_cm DISCONNECTED event its kernel triggers.
  std::uint8_t retry_count = 1;
  // GRADLANE_RNR_RETRY: retries when the peer has no receive posted; 7 means "forever" in the
  // IB spec, which is safe here because every wait in gradlane is bounded by a timeout.
  std::uint8_t rnr_retry = 7;
  // GRADLANE_CONNECT_TIMEOUT_MS: bound on address/route resolution and the connect handshake.
  std::chrono::milliseconds connect_timeout{5000};
  // GRADLANE_MAX_PENDING_ACCEPTS: connect requests a Listener has answered (each holds a QP
  // and registered rings) whose handshake has not completed yet. Past it, a request is refused
  // as busy (the connector is told so) until one completes or outlives connect_timeout: a burst
  // of requests, or peers that never finish theirs, cannot make the listener allocate without
  // bound. 64 is rdma_listen's backlog.
  std::uint32_t max_pending_accepts = 64;
  // GRADLANE_SQ_DEPTH: send-queue work requests per connection.
  std::uint32_t send_queue_depth = 256;
  // GRADLANE_RQ_DEPTH: receives kept posted per connection (control messages and the
  // WRITE_WITH_IMM doorbells both consume one).
  std::uint32_t recv_queue_depth = 128;
  // GRADLANE_SIGNAL_INTERVAL: one in every N writes is signalled so the send queue drains
  // without a completion per write. Must be ≤ send_queue_depth / 2 so a full queue always
  // has a signalled request in flight to free it.
  std::uint32_t signal_interval = 32;
  // GRADLANE_MAX_INLINE: payloads up to this many bytes are copied into the WQE by the NIC
  // driver (IBV_SEND_INLINE), which saves the NIC a DMA read for tiny writes. 0 disables.
  std::uint32_t max_inline = 64;
  // GRADLANE_MAX_MESSAGE: largest SEND/RECV control message, bytes.
  std::uint32_t max_message_bytes = 4096;
  // GRADLANE_TOS: the IP type-of-service byte (DSCP << 2) of the RoCE v2 packets of the
  // connections this side opens. A network that queues by DSCP (strict priority, or weighted
  // shares per class, as RoCE fabrics are configured) tells jobs apart by it. 0: not set.
  std::uint8_t type_of_service = 0;
  // GRADLANE_JOB_KEY: the job's shared secret, up to 32 bytes (empty: none). It travels in the
  // connect handshake; a listener refuses a peer whose key differs from its own (both sides
  // are told why), and a connector refuses a listener that answers with another key. It keeps
  // out processes that do not know it — another job's, a stray or rogue one — not an observer
  // of the fabric's packets: it is sent in the clear.
  // GRADLANE_JOB_KEY_FILE names a file holding the key instead (its first line), readable by
  // its owner alone (mode 0600 or stricter): a key in the environment shows in /proc.
  std::string job_key;
  // GRADLANE_INSECURE=1: the program runs without a job key, knowingly (from_env warns).
  bool insecure = false;

  // Applies GRADLANE_* overrides read through `getenv` (injectable for tests) and validates.
  // This is how gradlane's programs take their settings, so it refuses to run unauthenticated
  // by accident: without a job key it throws unless GRADLANE_INSECURE=1. Options built by hand
  // are the embedding program's decision (an empty key connects only to keyless peers).
  static TransportOptions from_env(const std::function<std::optional<std::string>(const char*)>& getenv = {});
  // The job key in `path`, checked as GRADLANE_JOB_KEY_FILE is: a regular file, mode 0600 or
  // stricter, one line of 1 to kMaxJobKeyBytes bytes. Throws Error(invalid_argument) saying
  // what to fix.
  static std::string read_key_file(const std::string& path);
  // Throws Error(invalid_argument) when the fields are inconsistent.
  void validate() const;
};

}  // namespace gradlane
