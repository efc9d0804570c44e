// One worker's connection at a ps::Aggregator, in either mode. Internal to the library.
#pragma once

#include <cstdint>

#include "gradlane/connection.hpp"
#include "ps/receiving/outstanding_grants.hpp"

namespace gradlane::ps {

struct MemberPeer {
  Connection conn;
  std::uint32_t worker = 0;
  bool alive = true;
  OutstandingGrants outstanding;  // direct mode
  std::uint32_t partition = 0;    // sidecar mode: its member slots' partition of the ring
  bool partition_back = false;    // sidecar mode: gone, and its partition given back to the pool
  bool said_bye = false;          // the worker said it finished: its disconnect is a leave
};

}  // namespace gradlane::ps
