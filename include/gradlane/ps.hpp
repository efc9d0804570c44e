// gradlane — the parameter-server data plane: a shard server that applies updates, a replica
// that mirrors it, and the worker's push/pull.
//
// Roles (each a process, or a thread of one):
//   ShardServer(Role::server)   holds a model shard in a registered region and a ring of update
//                               slots; applies updates strictly in sequence order with an SGD
//                               step; owns the shard's sequence in direct mode.
//   ShardServer(Role::replica)  the same regions; applies the same sequence, as the server
//                               decided it, never more than `slots` updates behind.
//   Worker                      computes into its registered gradient buffer, push()es it,
//                               pull()s the model into its registered model buffer.
//
// The push (direct mode, no sidecar; the plain asynchronous parameter server, FIFO):
//   1. worker → server  SEND request {worker, tag, computed_on}
//   2. server → worker  SEND grant {sequence}: the server hands out sequence numbers in request
//                       order, only while slot `sequence % slots` is free at the server and at
//                       the replica (the update that used it was applied and acknowledged).
//   3. worker → replica WRITE gradient into slot, zero-length WRITE_WITH_IMM (imm = low 32
//                       bits of the sequence) — the mirror, from the same registered buffer;
//      worker → server  the same WRITE + doorbell. Two posts, no copy.
//   4. server applies in sequence order (out-of-order arrivals wait in their slots), then
//      tells the replica each sequence's fate: applied, or skipped (a hole: its worker died
//      after the grant, or wrote nothing within hole_timeout). The replica applies exactly
//      what the server applied, in the same order, with the same kernel: bitwise the same
//      model at the same version. The replica acknowledges what it applied; the server never
//      grants a sequence whose slot the replica has not freed.
// Failover (direct mode): when the server dies, the replica sees its connection drop and
// becomes the server at the version it reached: no push a worker saw succeed is lost (the
// replica holds its mirror and applies it, skipping a sequence granted and never written
// before it), at most `slots` that the server applied and whose mirrors never came are.
// Workers switch their server to the replica (they are already connected to it); a push that
// was in flight reports lost = true, and pulls go to the new server. The promoted server
// grants from `slots` past the version it reached, as in sidecar mode below, so a late write
// granted by the dead server is refused. It has no replica until a new one joins it
// (ShardServer::join_server).
// With a sidecar (sidecar mode; the server and each worker attach to their host's gradlaned):
// the receiver's sidecar owns the sequence instead. A worker asks its sidecar (Client::request),
// and the go grant carries the sequence and the slot time; the worker writes as above and
// completes the grant with the measured wire time. The sidecar may drop an update that would
// break the staleness bound (push() says so: it never crossed the network). The server
// applies in sequence order as before, skips a sequence its sidecar cancels (the sender failed
// after its grant), and reports what server and replica have both applied (Client::applied),
// which is what lets the sidecar grant the slot again: gradlaned's --replica-bound must not
// exceed the shard's slots. Each update must be one part: the shard at most the sidecar's
// partition size (4 MiB).
// Failover (sidecar mode): the promoted replica attaches to its own host's gradlaned with
// AttachOptions::take_over_at, and that sidecar owns the server's sequence from then on (its
// peers forward the workers' requests there; the old owner drops what waited for the dead
// server, Reason::receiver_moved, which a worker reports as a lost push). The sequence goes
// on `slots` past the version the replica reached: every sequence the old owner may have
// granted (at most B ahead of the replica's ack, B = gradlaned's --replica-bound, which must
// not exceed the shard's slots) is skipped, so a late write granted
// by the old owner rings for a sequence already skipped and is refused, never applied as
// another worker's update; the promoted server publishes where it starts (its shard header's
// refuse_below) and a worker that failed over reads it after each write, so such a push
// reports lost = true instead of success. A floor of 0 there means the replica was never
// promoted: the worker's link to a server that lives failed (a link flap), and the server's
// sidecar still grants its sequence. Such a write is lost too (the server skips it); past
// failover_patience the worker throws Error(unreachable) and its caller rejoins the job.
// Aggregation (direct mode): workers told to push to an Aggregator (WorkerOptions::aggregator)
// ask it for a member slot instead of the server — the same request / grant / WRITE +
// doorbell, into the aggregator's ring, and nothing to the replica. The aggregator takes
// members in its own sequence order, and once `group` of them are here it sums them with the
// Eigen kernel in a fixed order (by worker id, then tag) straight into the registered buffer
// of its own ps::Worker, which pushes that one update to the server and the replica like any
// worker (its id at the server is AggregatorOptions::id; its tag, the group's number). So the
// server and the replica spend one slot, one version and one update's bytes per group. The
// aggregate's computed_on is its OLDEST member's: its staleness is never understated. Members
// that were granted and never written (dead worker, hole_timeout) are left out; a group
// forwards short when no member is coming (workers gone, or `linger` without one). Pulls still
// go to the server. A worker whose aggregator dies reports the push lost and pushes to the
// server directly from then on.
// A member's acknowledgment (both modes): push() returns once the member is in the
// aggregator's slot (PushResult::pending) — the gradient buffer is free again, but the update
// has not reached the server. The aggregator tells each member's worker, after its forward
// completed, that the member was delivered (the server's sequence for the sum) or not
// (Forwarded message); Worker::take_member_outcomes() reports it. A member whose aggregator
// dies before that is reported not delivered: it may have been summed into a forward that
// reached the server, but nothing acknowledged is ever missing there; so is one written after
// its grant was written off (direct mode). In sidecar mode a member the aggregator gives up on
// (overwritten in its slot, or its aggregate never granted) gets no outcome: it stays pending
// and settle() returns false. Worker::settle() says
// the worker pushes no more (the aggregator forwards what it holds at once) and waits for the
// outcomes.
// Aggregation (sidecar mode): gradlaned decides it (gradlaned --aggregator JOB:ENDPOINT names
// the endpoint whose Aggregator, attached in sidecar mode, may sum a job's updates). When
// updates would queue for the server's ingress, its scheduler redirects a group of them: each
// member's worker gets a redirect grant (sequence = the aggregate id, a slot at the aggregator)
// and writes its gradient into its own member slot there (aggregate id % slots), doorbell = the
// id's low 32 bits; the aggregator gets one aggregate grant (the server's sequence, the member
// count, a slot), sums the members that came in a fixed order (worker id) and writes the sum
// as that sequence to the server and the replica, like any granted update. The scheduler
// gives the group the staleness of its stalest member, so tau holds for the sum.
// The pull: three chained RDMA READs of the server's model region (header, floats, header);
// the copy is accepted only if both headers show the same even version (a seqlock: the server
// marks the header odd while it applies) and the floats match the checksum the server published
// with that version (so it holds on a NIC that serves the READs out of order), else it is read
// again. No server CPU on the path.
//
// Errors: a peer that dies is dropped (its granted sequences become holes, skipped in order);
// a malformed control message costs the peer that sent it its connection, never the server.
#pragma once

// One header per role; this one includes them all.
#include "gradlane/ps/aggregator.hpp"
#include "gradlane/ps/server.hpp"
#include "gradlane/ps/sharded.hpp"
#include "gradlane/ps/worker.hpp"
