// What a gradlaned that died without cleaning up leaves behind that its successor must know:
// the server apps still running that it handed a sequence out for.
//
// Why: such a server's sequence went on under the dead daemon, and its workers may hold grants
// for numbers up to its slots past what it applied. A new daemon that granted from 1 would put
// a write into a slot (sequence % slots) that may hold an update not yet applied. So the new
// daemon holds those receivers (Scheduler::hold_receiver) until their server attaches again
// taking its sequence over (AttachOptions::take_over_at; ps::ShardServer does so by itself).
// A daemon that stopped cleanly unlinked its segment: there is nothing to read, so its
// successor holds nothing; its server apps still attach taking their sequence over.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradlane::sidecar {

// The endpoints of server apps (AttachOptions::slots != 0) attached to the segment `name` of a
// dead daemon (it exists, is ours, and no daemon holds its lock) whose processes still live.
// Empty if there is no such segment. Never throws: a segment it cannot read holds nothing.
std::vector<std::uint32_t> surviving_servers(const std::string& name);

}  // namespace gradlane::sidecar
