// Internal: access to a Client's queues for tests that must write what the public API never
// would (malformed entries, a corrupted index). Not installed; not for applications.
#pragma once

#include "gradlane/sidecar.hpp"
#include "sidecar/client/client_state.hpp"
#include "sidecar/shm/futex.hpp"

namespace gradlane::sidecar {

struct ClientInternals {
  // Queues `entry` exactly as given (no validation, no bookkeeping) and rings the daemon.
  static shm::RingStatus push_raw(Client& client, const shm::AppEntry& entry) {
    Client::State& s = *client.state_;
    const shm::RingStatus status = s.requests.push(entry);
    if (status == shm::RingStatus::ok) shm::ring_bell(s.header->daemon_sleeping, s.header->doorbell);
    return status;
  }
  static shm::AppSlot& slot(Client& client) { return *client.state_->slot; }
  static shm::Header& header(Client& client) { return *client.state_->header; }
};

}  // namespace gradlane::sidecar
