// The owners book: which job's server each receiver endpoint is, kept by gradlaned in its
// shared segment's header (Header::owners) so that a successor can read it after a crash.
//
// Why: a restarted daemon holds a receiver for the server that outlived its predecessor, and
// finds that server in the segments the apps wrote. A job's apps write their own segment, so
// a record there could name another job's endpoint whose server stopped; the owners book says
// which job the dead daemon seated as that endpoint's server, and only that job's record counts.
// The shared segment is the daemon user's (mode 0600): another user's job cannot write it, and
// the daemon's own user is its trust domain anyway.
//
// Only the daemon writes, and nobody reads while it runs: an entry is emptied before it is
// rewritten and its endpoint written last, so a daemon killed mid-write leaves it empty (that
// receiver is then held for nobody: its server stops at the takeover's refusal and its replica
// takes over), never naming the wrong job.
#pragma once

#include <cstdint>
#include <map>

#include "sidecar/shm/layout.hpp"

namespace gradlane::sidecar::shm {

class OwnerBook {
 public:
  explicit OwnerBook(Header& header) noexcept : header_(&header) {}

  // `endpoint`'s server is an app of `job` from now on. False if the book is full (each entry
  // names another endpoint): the endpoint is then held for nobody after a crash.
  bool record(std::uint32_t endpoint, std::uint32_t job) noexcept;
  // No job owns `endpoint` any more (its server detached).
  void release(std::uint32_t endpoint) noexcept;

  // The book a dead daemon left: endpoint -> job. An endpoint named twice (written by no
  // daemon: the book does not say) is left out.
  static std::map<std::uint32_t, std::uint32_t> read(const Header& header);

 private:
  OwnedEndpoint* find(std::uint32_t endpoint) noexcept;
  Header* header_;
};

}  // namespace gradlane::sidecar::shm
