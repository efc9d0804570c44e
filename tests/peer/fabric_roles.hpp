// The processes of the two-sidecar softroce test (sidecar_softroce_test.cpp). Each runs as
// `gradlane_sidecar_softroce_tests --role NAME ARGS...` and writes what it saw, one JSON
// object per line, to $GRADLANE_OUT_DIR/NAME.jsonl, so the test checks the schedule from the
// receiver's side (server, receiver sidecar's log) and from the senders' side (workers).
#pragma once

namespace gradlane::testing {

// --role server DEVICE PORT SLOT_BYTES TOTAL_UPDATES CONNECTIONS
//   Registers TOTAL_UPDATES slots, accepts CONNECTIONS workers, and records every doorbell:
//   {"seq":S,"at":NS,"payload_ok":true}. Update with sequence S lands in slot S-1.
// --role worker NAME SHM JOB ENDPOINT DEVICE SERVER_ADDR PORT RECEIVER SLOT_BYTES UPDATES
//   Attaches to the sidecar at SHM, asks for UPDATES sends, and for each grant waits for its
//   slot, writes the payload then a WRITE_WITH_IMM doorbell carrying the sequence, reports
//   completion, and records {"seq":S,"slot_start":NS,"slot_end":NS,"started":NS,"done":NS}.
int run_role(int argc, char** argv);

}  // namespace gradlane::testing
