#!/bin/sh
# One training job inside the Soft-RoCE harness: data-parallel SGD on Fashion-MNIST with
# gradlane_train. examples/train.sh runs it (and evaluates the recorded models afterwards,
# outside the emulator, where it is ~50× faster). Hosts:
#   host 0: the server (endpoint 0)            host 1: the replica, workers 2, 4, ... (endpoint 1)
#   host 2: workers 1, 3, ... (endpoint 2)     host 3 (STRAGGLER=1): the last worker (endpoint 3)
# aggregate mode: the aggregator on host 2 (port 7802); every worker pushes to it.
# gradlane mode: gradlaned A on host 0 serves endpoints 0, 2 and 3; gradlaned B on host 1
# serves endpoint 1 and reaches A over RDMA.
#   bash ci/softroce.sh --hosts 3 -- sh examples/train-job.sh build [NAME=VALUE ...]
# Settings (NAME=VALUE arguments): MODE=gradlane|fifo|sync|aggregate (gradlane), GROUP (aggregate:
#   gradients per forwarded update, WORKERS), MODEL=softmax|mlp (softmax),
#   WORKERS (4), STEPS per worker (150), LR (0.05; sync: 0.2), BATCH (64), SEED (1),
#   TAU (gradlaned's staleness bound, 2×WORKERS), TARGET (0.75), SCHEDULE=1 prints gradlaned's
#   schedule, REPLICA=0 runs without a replica, REPLICA_READS=1 has the replica READ each update
#   from the server's slot instead of every worker mirroring it, STRAGGLER=1 puts the last worker alone on host 3
#   (which train.sh shapes). Results: $GRADLANE_OUT_DIR/train-$MODE.
#   FAULT=KIND:TARGET:DELAY_MS (examples/train-fault.sh, which examples/train-faults.sh drives):
#   one fault injected DELAY_MS after training starts. Every role records its pid
#   (NAME.pid) and its exit status and time (NAME.exit: "STATUS EPOCH_SECONDS").
set -u
BUILD=${1:?usage: train-demo.sh BUILD_DIR [NAME=VALUE ...]}
shift
for setting in "$@"; do
  case $setting in
    MODE=*|MODEL=*|WORKERS=*|STEPS=*|LR=*|BATCH=*|SEED=*|TAU=*|TARGET=*|SCHEDULE=*|REPLICA=*|SLOTS=*|STRAGGLER=*|GROUP=*|REPLICA_READS=*|FAULT=*) export "$setting" ;;
    *) echo "train-demo.sh: unknown setting '$setting' (see the comment at the top)" >&2; exit 2 ;;
  esac
done
MODE=${MODE:-gradlane}; MODEL=${MODEL:-softmax}; WORKERS=${WORKERS:-4}; STEPS=${STEPS:-150}
BATCH=${BATCH:-64}; SEED=${SEED:-1}; TAU=${TAU:-$((2 * WORKERS))}; TARGET=${TARGET:-0.75}
if [ "$MODE" = sync ]; then LR=${LR:-0.2}; else LR=${LR:-0.05}; fi
REPLICA=${REPLICA:-1}; SLOTS=${SLOTS:-8}; STRAGGLER=${STRAGGLER:-0}; GROUP=${GROUP:-$WORKERS}
OUT=${GRADLANE_OUT_DIR:-/tmp}/train-$MODE
set -- $GRADLANE_HOSTS
DEV0=${1%%,*}; ADDR0=${1#*,}; DEV1=${2%%,*}; ADDR1=${2#*,}; DEV2=${3%%,*}; ADDR2=${3#*,}; DEV3=${4:-none}; DEV3=${DEV3%%,*}
TRAIN="$BUILD/examples/gradlane_train"
D="$BUILD/sidecar/daemon/gradlaned"
rm -rf "$OUT"; mkdir -p "$OUT"
COMMON="--mode $MODE --model $MODEL --workers $WORKERS --lr $LR --seed $SEED --slots $SLOTS --out $OUT"
[ "${REPLICA_READS:-0}" = 1 ] && COMMON="$COMMON --replica-reads"
REPLICA_AT=""; [ "$REPLICA" = 1 ] && REPLICA_AT="--replica $ADDR1:7801"

echo "== $MODE$([ "$STRAGGLER" = 1 ] && echo " (worker $WORKERS a straggler on host 3)"): $WORKERS workers x $STEPS steps, $MODEL, batch $BATCH, lr $LR$([ "$MODE" = gradlane ] && echo ", tau $TAU")$([ "$MODE" = aggregate ] && echo ", groups of $GROUP on host 2")$([ "$REPLICA" = 1 ] && echo ", replica on host 1")"
# Bytes on the links (the bridge port h<i>-p transmits what host i receives): the proof that the
# traffic crossed the shaped links, and the server's ingress per applied gradient.
link_bytes() {
  for dev in /sys/class/net/h[0-9]-p; do
    [ -d "$dev" ] || continue
    n=${dev##*/}; n=${n%-p}
    printf '"%s":{"rx":%s,"tx":%s},' "$n" "$(cat "$dev/statistics/tx_bytes")" "$(cat "$dev/statistics/rx_bytes")"
  done
}
BYTES_BEFORE=$(link_bytes)
# role NAME CMD...: runs CMD in the background with its output in NAME.log, its pid in NAME.pid
# (the process itself, for a fault to target) and "STATUS TIME" in NAME.exit when it ends.
role() {
  name=$1; shift
  ( sh -c 'echo $$ > "$0"; exec "$@"' "$OUT/$name.pid" "$@" > "$OUT/$name.log" 2>&1
    rc=$?; echo "$rc $(date +%s.%N)" > "$OUT/$name.exit"; exit $rc ) &
}
PIDS=""
SERVER_PEERS=""; REPLICA_PEERS=""; WORKER_TO=""
if [ "$MODE" = aggregate ]; then  # workers pull from the server; only the aggregator mirrors
  SERVER_PEERS="--peers $((WORKERS + 1))"; REPLICA_PEERS="--peers 1"; WORKER_TO="--aggregator $ADDR2:7802"
  role aggregator "$TRAIN" aggregator $COMMON --device "$DEV2" --port 7802 --id $((WORKERS + 1)) --server "$ADDR0:7800" $REPLICA_AT \
           --group "$GROUP"
  G=$!
fi
if [ "$MODE" = gradlane ]; then
  BOUND=$([ "$REPLICA" = 1 ] && echo "$SLOTS" || echo 0)
  "$D" --foreground --shm-name /gradlane-train-a --device "$DEV0" --endpoint 0 --endpoint 2 --endpoint 3 --listen-port 7600 \
       --expect-peers 1 --staleness-bound "$TAU" --replica-bound "$BOUND" --schedule-log "$OUT/schedule.jsonl" \
       > "$OUT/gradlaned-a.log" 2>&1 &
  A=$!
  "$D" --foreground --shm-name /gradlane-train-b --device "$DEV1" --endpoint 1 --listen-port 7601 \
       --peer "$ADDR0:7600" --staleness-bound "$TAU" --replica-bound "$BOUND" > "$OUT/gradlaned-b.log" 2>&1 &
  B=$!
fi
sidecar() {  # ENDPOINT: the options that attach a role on that endpoint's host to its gradlaned
  [ "$MODE" = gradlane ] || return 0
  if [ "$1" = 1 ]; then echo "--sidecar /gradlane-train-b --endpoint 1"; else echo "--sidecar /gradlane-train-a --endpoint $1"; fi
}
if [ "$REPLICA" = 1 ]; then
  role replica "$TRAIN" replica $COMMON --device "$DEV1" --port 7801 $REPLICA_PEERS
  R=$!
fi
role server "$TRAIN" server $COMMON --device "$DEV0" --port 7800 $REPLICA_AT $SERVER_PEERS $(sidecar 0)
S=$!
[ -n "${FAULT:-}" ] || { tail -n +1 -F "$OUT/server.log" 2>/dev/null & TAIL=$!; }  # the progress lines, as before
i=1
while [ $i -le "$WORKERS" ]; do
  if [ "$STRAGGLER" = 1 ] && [ $i -eq "$WORKERS" ]; then dev=$DEV3; ep=3
  elif [ $((i % 2)) -eq 1 ]; then dev=$DEV2; ep=2; else dev=$DEV1; ep=1; fi
  role worker$i "$TRAIN" worker $COMMON --device "$dev" --id $i --server "$ADDR0:7800" $([ "$MODE" = aggregate ] || echo "$REPLICA_AT") $WORKER_TO --steps "$STEPS" \
           --batch "$BATCH" $(sidecar $ep) --server-endpoint 0
  PIDS="$PIDS $!"
  i=$((i + 1))
done
INJECTOR=""
if [ -n "${FAULT:-}" ]; then
  sh "$(dirname "$0")/train-fault.sh" "$OUT" "$FAULT" > "$OUT/fault.log" 2>&1 &
  INJECTOR=$!
fi
failed=0
for p in $PIDS; do wait "$p" || failed=1; done
[ "$MODE" = aggregate ] && { wait $G || failed=1; }
wait $S || failed=1
[ -n "${TAIL:-}" ] && { sleep 0.2; kill $TAIL 2>/dev/null; }
printf '{"before":{%s},"after":{%s}}\n' "$(echo "$BYTES_BEFORE" | sed 's/,$//')" "$(link_bytes | sed 's/,$//')" > "$OUT/link-bytes.json"
[ "$REPLICA" = 1 ] && { wait $R || failed=1; }
if [ "$MODE" = gradlane ]; then kill -TERM $A $B; wait $A $B 2>/dev/null; fi
[ -n "$INJECTOR" ] && wait $INJECTOR
[ $failed = 0 ] || { echo "a role failed:"; tail -n 3 "$OUT"/*.log; }
if [ "${SCHEDULE:-0}" = 1 ] && [ "$MODE" = gradlane ]; then
  python3 "$(dirname "$0")/print_schedule.py" "$OUT/schedule.jsonl"
fi
if [ "$REPLICA" = 1 ]; then
  if cmp -s "$OUT/server.model" "$OUT/replica.model"; then echo "server and replica models: bitwise equal"
  else echo "server and replica models: DIFFERENT"; failed=1; fi
fi
exit $failed
