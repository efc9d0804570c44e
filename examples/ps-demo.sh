#!/bin/sh
# The parameter-server data plane, end to end over Soft-RoCE, in two acts:
#   1. sidecar mode: gradlaned A (host 0: the server's NIC, endpoint 0, and host 2's, endpoint 2)
#      owns the server's sequence; gradlaned B (host 1, endpoint 1) reaches it over RDMA. Four
#      workers (two on host 1, two on host 2) pull, compute and push 30 updates each; the server
#      applies them in sequence order, the replica (host 1) mirrors them. Then: are server and
#      replica bitwise equal?
#   2. failover: the same run in direct mode, and the server kills itself (SIGKILL) after 50
#      updates; the replica takes over and the workers finish against it.
#   3. aggregation: the same four workers push to an aggregator (host 2) that sums groups of 4
#      and forwards each sum to the server and the replica as one update: 120 gradients, 30
#      server updates, and a quarter of the server's ingress bytes.
# Run it through the harness (after `bash ci/test.sh` built build/):
#   bash ci/softroce.sh --hosts 3 -- sh examples/ps-demo.sh build
set -u
BUILD=${1:?usage: ps-demo.sh BUILD_DIR}
OUT=${GRADLANE_OUT_DIR:-/tmp}
. "$(dirname "$0")/../ci/softroce/job-key.sh"; make_job_key "$OUT"
set -- $GRADLANE_HOSTS
DEV0=${1%%,*}; ADDR0=${1#*,}; DEV1=${2%%,*}; ADDR1=${2#*,}; DEV2=${3%%,*}
NODE="$BUILD/tests/ps/ps_node"
D="$BUILD/sidecar/daemon/gradlaned"
COMMON="floats=65536 slots=8 workers=4 updates=30"

workers() {  # OUT_DIR EXTRA...  (workers 1, 2 on host 2; 3, 4 on host 1)
  dir=$1; shift
  for i in 1 2 3 4; do
    if [ $i -le 2 ]; then dev=$DEV2; sc="endpoint=2 sidecar=/gradlane-demo-a"; else dev=$DEV1; sc="endpoint=1 sidecar=/gradlane-demo-b"; fi
    [ "${SIDECAR:-}" = 1 ] || sc=""
    "$NODE" role=worker device=$dev id=$i server=$ADDR0:7800 replica=$ADDR1:7801 floats=65536 updates=30 \
      gradient=pattern out="$dir" $sc server_endpoint=0 "$@" > "$dir/worker$i.log" 2>&1 &
  done
}

echo "== 1. sidecar mode: 4 workers x 30 updates of 256 KiB, server + replica, 2 gradlaneds"
mkdir -p "$OUT/sidecar"
"$D" --foreground --shm-name /gradlane-demo-a --device "$DEV0" --endpoint 0 --endpoint 2 --listen-port 7600 \
     --expect-peers 1 --link-rate-gbps 0.2 --replica-bound 8 --schedule-log "$OUT/sidecar/schedule.jsonl" \
     > "$OUT/sidecar/gradlaned-a.log" 2>&1 &
A=$!
"$D" --foreground --shm-name /gradlane-demo-b --device "$DEV1" --endpoint 1 --listen-port 7601 \
     --peer "$ADDR0:7600" --link-rate-gbps 0.2 --replica-bound 8 > "$OUT/sidecar/gradlaned-b.log" 2>&1 &
B=$!
"$NODE" role=replica device=$DEV1 port=7801 $COMMON out="$OUT/sidecar" > "$OUT/sidecar/replica.log" 2>&1 &
R=$!
"$NODE" role=server device=$DEV0 port=7800 $COMMON out="$OUT/sidecar" replica=$ADDR1:7801 \
        sidecar=/gradlane-demo-a endpoint=0 > "$OUT/sidecar/server.log" 2>&1 &
S=$!
SIDECAR=1 workers "$OUT/sidecar"
wait $S; wait $R
kill -TERM $A $B; wait $A $B 2>/dev/null
grep -h "version" "$OUT/sidecar/server.log" "$OUT/sidecar/replica.log"
grants=$(grep -c '"origin":"here","kind":"go"' "$OUT/sidecar/schedule.jsonl")
echo "sequence numbers granted by the server's sidecar: $grants"
if cmp -s "$OUT/sidecar/server.model" "$OUT/sidecar/replica.model"; then
  echo "server and replica models: bitwise equal"; ok1=0
else
  echo "server and replica models: DIFFERENT"; ok1=1
fi

ingress() { cat "/sys/class/net/$(cat /sys/class/infiniband/$DEV0/parent)/statistics/rx_bytes"; }

echo "== 2. failover: the server is killed (SIGKILL) after 50 updates"
mkdir -p "$OUT/failover"
"$NODE" role=replica device=$DEV1 port=7801 $COMMON out="$OUT/failover" > "$OUT/failover/replica.log" 2>&1 &
R=$!
"$NODE" role=server device=$DEV0 port=7800 $COMMON out="$OUT/failover" replica=$ADDR1:7801 die_at=50 \
        > "$OUT/failover/server.log" 2>&1 &
workers "$OUT/failover"
wait $R; ok2=$?
read died version < "$OUT/failover/server.died"
promoted=$(sed 's/.*"promoted_at_ns":\([0-9]*\).*/\1/' "$OUT/failover/replica.stats.json")
echo "server killed at version $version; replica promoted $(( (promoted - died) / 1000000 )) ms later"
grep -h "version" "$OUT/failover/replica.log"
cat "$OUT"/failover/worker*.json | sed 's/^/worker: /'

echo "== 3. aggregation: the 4 workers push to an aggregator on host 2 that sums groups of 4"
mkdir -p "$OUT/aggregation"
rx0=$(ingress)
AGG="floats=65536 slots=8 workers=5 updates=30 out=$OUT/aggregation"  # 4 workers + the aggregator
"$NODE" role=replica device=$DEV1 port=7811 $AGG > "$OUT/aggregation/replica.log" 2>&1 &
R=$!
"$NODE" role=server device=$DEV0 port=7810 $AGG replica=$ADDR1:7811 > "$OUT/aggregation/server.log" 2>&1 &
S=$!
"$NODE" role=aggregator device=$DEV2 port=7812 id=9 server=$ADDR0:7810 replica=$ADDR1:7811 floats=65536 group=4 \
        workers=4 out="$OUT/aggregation" > "$OUT/aggregation/aggregator.log" 2>&1 &
G=$!
ADDR2=${3#*,}
for i in 1 2 3 4; do
  if [ $i -le 2 ]; then dev=$DEV2; else dev=$DEV1; fi
  "$NODE" role=worker device=$dev id=$i server=$ADDR0:7810 replica=$ADDR1:7811 aggregator=$ADDR2:7812 \
    floats=65536 updates=30 gradient=pattern out="$OUT/aggregation" > "$OUT/aggregation/worker$i.log" 2>&1 &
done
wait $G; ok3=$?
wait $S; wait $R
grep -h "forwarded\|version" "$OUT/aggregation/aggregator.log" "$OUT/aggregation/server.log" "$OUT/aggregation/replica.log"
echo "server ingress: $(( ($(ingress) - rx0) / 1048576 )) MiB for 120 gradients of 256 KiB (30 MiB of them)"
if cmp -s "$OUT/aggregation/server.model" "$OUT/aggregation/replica.model"; then
  echo "server and replica models: bitwise equal"
else
  echo "server and replica models: DIFFERENT"; ok3=1
fi
exit $((ok1 | ok2 | ok3))
