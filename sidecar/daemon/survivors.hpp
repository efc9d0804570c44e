// What a gradlaned that died without cleaning up leaves behind that its successor must know:
// the server apps still running that it handed a sequence out for.
//
// Why: such a server's sequence went on under the dead daemon, and its workers may hold grants
// for numbers up to its slots past what it applied. A new daemon that granted from 1 would put
// a write into a slot (sequence % slots) that may hold an update not yet applied. So the new
// daemon holds those receivers (Scheduler::hold_receiver) until their server attaches again
// taking its sequence over (AttachOptions::take_over_at; ps::ShardServer does so by itself).
// A daemon that stopped cleanly unlinked its segment: there is nothing to read, so its
// successor holds nothing and refuses a takeover of that endpoint (bad_takeover, without
// --standby): its server apps stop, and their replicas take over.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gradlane::sidecar {

// A server app found alive in a dead daemon's segment: only that very process (pid and start
// time), of that job, may take the endpoint's sequence over at the new daemon.
struct Survivor {
  std::uint32_t endpoint = 0;
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;
  std::uint32_t job = 0;
};

// The server apps (AttachOptions::slots != 0) attached to the segment `name` of a dead daemon
// (it exists, no daemon holds its lock, and it belongs to `owner_uid` — the user gradlaned
// made it for: its own, or the job's) whose processes still live. Empty if there is no such
// segment, or one of another owner (anyone can create a name in /dev/shm: a planted "survivor"
// must not make a daemon hold an endpoint). Never throws: a segment it cannot read holds nothing.
std::vector<Survivor> surviving_servers(const std::string& name, std::uint32_t owner_uid);

// The same for a job's own segment (--job-user): a sealed memfd labelled `label` with no name
// to open, kept alive by the apps that still map it. Found through /proc/<pid>/fd of those apps
// (a root daemon may open them; another finds only its own user's); it counts only if its file
// belongs to `owner_uid` (the daemon's user, who made it: a memfd an app made under the same
// label is ignored) and is sealed against resizing.
std::vector<Survivor> surviving_servers_in_job_segment(const std::string& label, std::uint32_t owner_uid);

// The owners book the dead daemon left in its shared segment `name` (shm/owner_book.hpp):
// endpoint -> the job it seated as that endpoint's server. Empty under the same conditions as
// surviving_servers(): no such segment, another owner's, or another layout.
std::map<std::uint32_t, std::uint32_t> endpoint_owners(const std::string& name, std::uint32_t owner_uid);

// The survivors read from one segment of the dead daemon: the shared one (job: none) or a
// job's own.
struct SurvivorsIn {
  std::optional<std::uint32_t> job;
  std::vector<Survivor> survivors;
};
// An endpoint to hold, for the survivor that may take it over, found in segments[segment].
struct HeldEndpoint {
  Survivor server;
  std::uint32_t segment = 0;
};
// Which endpoints the new daemon holds. A record is written by the apps of its segment, so one
// counts only as far as that segment vouches for it — a job's own segment for that job's
// servers alone, the shared one for the jobs without a segment of their own — and only for an
// endpoint the dead daemon's `owners` book gives to that job (a job could write a record for
// another job's endpoint in its own segment), and that this daemon serves.
std::map<std::uint32_t, HeldEndpoint> endpoints_to_hold(const std::vector<SurvivorsIn>& segments,
                                                        const std::map<std::uint32_t, std::uint32_t>& owners,
                                                        const std::function<bool(std::uint32_t)>& serves);

}  // namespace gradlane::sidecar
