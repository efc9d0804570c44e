#!/bin/sh
# The main job: two gradlaned sidecars on two emulated hosts schedule gradient pushes from
# three training jobs to one parameter server, then the receiver's schedule is printed.
#   host A (rxe0, endpoint 0): the server; its second NIC rxe2 (endpoint 2) runs job 3's worker
#   host B (rxe1, endpoint 1): workers of jobs 1 and 2 — its link is the slow one when the
#   harness is started with --shape 1:RATE
# Run it through the harness:  bash ci/softroce.sh --hosts 3 --shape 1:40mbit -- sh examples/sidecar-demo.sh build
set -eu
BUILD=${1:?usage: sidecar-demo.sh BUILD_DIR}
OUT=${GRADLANE_OUT_DIR:-/tmp}
. "$(dirname "$0")/../ci/softroce/job-key.sh"; make_job_key "$OUT"
set -- $GRADLANE_HOSTS
DEV_A=${1%%,*}; ADDR_A=${1#*,}; DEV_B=${2%%,*}; DEV_C=${3%%,*}
SLOT=262144 UPDATES=6
D="$BUILD/sidecar/daemon/gradlaned"
P="$BUILD/examples/sidecar_push"

"$D" --foreground --shm-name /gradlane-demo-a --device "$DEV_A" --endpoint 0 --endpoint 2 --listen-port 7600 \
     --expect-peers 1 --link-rate-gbps 0.2 --schedule-log "$OUT/sidecar-a.jsonl" &
A=$!
"$D" --foreground --shm-name /gradlane-demo-b --device "$DEV_B" --endpoint 1 --listen-port 7601 \
     --peer "$ADDR_A:7600" --link-rate-gbps 0.2 --schedule-log "$OUT/sidecar-b.jsonl" &
B=$!
"$P" server "$DEV_A" 7700 $SLOT $((3 * UPDATES)) 3 &
S=$!
"$P" worker job1 /gradlane-demo-b 1 1 "$DEV_B" "$ADDR_A" 7700 0 $SLOT $UPDATES &
W1=$!
"$P" worker job2 /gradlane-demo-b 2 1 "$DEV_B" "$ADDR_A" 7700 0 $SLOT $UPDATES &
W2=$!
"$P" worker job3 /gradlane-demo-a 3 2 "$DEV_C" "$ADDR_A" 7700 0 $SLOT $UPDATES
status=0
wait $W1 || status=1
wait $W2 || status=1
wait $S || status=1
kill -TERM $A $B
wait $A $B || true
python3 "$(dirname "$0")/print_schedule.py" "$OUT/sidecar-a.jsonl"
exit $status
