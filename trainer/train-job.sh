#!/bin/sh
# One training job inside the Soft-RoCE harness: data-parallel SGD on Fashion-MNIST with
# gradlane_train. trainer/train.sh runs it (and evaluates the recorded models afterwards,
# outside the emulator, where it is ~50× faster). Hosts:
#   host 0: the server                host 1: the replica, workers 2, 4, ...
#   host 2: workers 1, 3, ...         host 3 (STRAGGLER=1): the last worker
# aggregate mode: the aggregator on host 2 (port 7802); every worker pushes to it.
# gradlane mode: gradlaned A on host 0 serves the server (endpoint 0), the aggregator (4) and
# the workers of hosts 2 and 3 (100 + id); gradlaned B on host 1 serves host 1's workers and
# reaches A over RDMA. The aggregator (AGGREGATE=1, the default) runs on host 2; A redirects
# updates to it when they would wait for the server.
#   bash ci/softroce.sh --hosts 3 -- sh trainer/train-job.sh build [NAME=VALUE ...]
# Settings (NAME=VALUE arguments): MODE=gradlane|fifo|sync|aggregate|backup|ssp (gradlane), GROUP
#   (aggregate: gradients per forwarded update, WORKERS), BACKUP (backup: backup workers, 1; each
#   step averages the first WORKERS − BACKUP gradients), SSP_BOUND (ssp: the steps a worker may
#   run ahead of the slowest, 3), MODEL=softmax|mlp (softmax),
#   WORKERS (4), STEPS per worker (150), LR (0.05; sync and backup: 0.2), BATCH (64), SEED (1),
#   TAU (gradlaned's staleness bound, 2×WORKERS), AGGREGATE=0 (gradlane mode without the
#   aggregator: ordering and tau only), EAGER=0 (gradlaned without --aggregate-eagerly: only
#   the updates waiting behind a grant are grouped, and no relays), RELAY (gradlaned's
#   --relay-slower-than, 2: a straggler's update goes through the aggregator; 0: never),
#   INGRESS=packed (gradlaned's --ingress-sharing: concurrent grants packed into the server's
#   line rate, each at its sender's share; default exclusive: one grant at a time), TARGET
#   (0.75), SCHEDULE=1 prints gradlaned's
#   schedule, REPLICA=0 runs without a replica, REPLICA_READS=1 has the replica READ each update
#   from the server's slot instead of every worker mirroring it, GRANT_WINDOWS=1 has server and
#   replica open each slot only to its grantee (a memory window per grant, claimed with the
#   grant's token where the server did not bind it) and the aggregator each worker's partition
#   only to that worker, STRAGGLER=1 puts the last worker alone on host 3
#   (which train.sh shapes), SERVER_RATE (the server's ingress as train.sh shaped it, e.g. 4mbit:
#   gradlaned is told it, as it would be told a NIC's line rate; the straggler is learned).
#   DATA (Fashion-MNIST's directory, default Debian's: gradlane_train --data). SHARD=1: each
#   worker trains only on its own partition of the training rows (gradlane_train --shard).
#   Results: $GRADLANE_OUT_DIR/train-$MODE.
#   FAULT=KIND:TARGET:AT (tests/faults/inject-fault.sh, which tests/faults/run-faults.sh drives):
#   one fault injected once the server reaches version K (AT=vK), or AT ms after training starts. Every role records its pid
#   (NAME.pid), its command (NAME.cmd) and its exit status and time (NAME.exit: "STATUS EPOCH_SECONDS").
set -u
BUILD=${1:?usage: train-job.sh BUILD_DIR [NAME=VALUE ...]}
shift
for setting in "$@"; do
  case $setting in
    MODE=*|BACKUP=*|SSP_BOUND=*|SHARD=*|MODEL=*|WORKERS=*|STEPS=*|LR=*|BATCH=*|SEED=*|TAU=*|TARGET=*|SCHEDULE=*|REPLICA=*|SLOTS=*|STRAGGLER=*|GROUP=*|REPLICA_READS=*|GRANT_WINDOWS=*|AGGREGATE=*|EAGER=*|RELAY=*|INGRESS=*|SERVER_RATE=*|FAULT=*|DATA=*) export "$setting" ;;
    *) echo "train-job.sh: unknown setting '$setting' (see the comment at the top)" >&2; exit 2 ;;
  esac
done
MODE=${MODE:-gradlane}; MODEL=${MODEL:-softmax}; WORKERS=${WORKERS:-4}; STEPS=${STEPS:-150}
BATCH=${BATCH:-64}; SEED=${SEED:-1}; TAU=${TAU:-$((2 * WORKERS))}; TARGET=${TARGET:-0.75}
case $MODE in sync|backup) LR=${LR:-0.2} ;; *) LR=${LR:-0.05} ;; esac
REPLICA=${REPLICA:-1}; SLOTS=${SLOTS:-8}; STRAGGLER=${STRAGGLER:-0}; GROUP=${GROUP:-$WORKERS}
AGGREGATE=${AGGREGATE:-1}; [ "$MODE" = gradlane ] || AGGREGATE=0
OUT=${GRADLANE_OUT_DIR:-/tmp}/train-$MODE
# How long an app waits for its gradlaned to come back (a restarted one: it reattaches) before it
# fails with a clear error: 3 s after the 1 s a dead daemon's heartbeat takes to go stale, so a
# daemon that is gone for good still ends its apps within the 5 s a fault allows.
export GRADLANE_SIDECAR_TIMEOUT_MS=${GRADLANE_SIDECAR_TIMEOUT_MS:-3000}
set -- $GRADLANE_HOSTS
DEV0=${1%%,*}; ADDR0=${1#*,}; DEV1=${2%%,*}; ADDR1=${2#*,}; DEV2=${3%%,*}; ADDR2=${3#*,}; DEV3=${4:-none}; DEV3=${DEV3%%,*}
TRAIN="$BUILD/trainer/gradlane_train"
D="$BUILD/sidecar/daemon/gradlaned"
rm -rf "$OUT"; mkdir -p "$OUT"
. "$(dirname "$0")/../ci/softroce/job-key.sh"; make_job_key "$OUT"
KEY=${GRADLANE_JOB_KEY_FILE:+--key-file $GRADLANE_JOB_KEY_FILE}  # gradlaned's peer links
COMMON="--mode $MODE --model $MODEL --workers $WORKERS --lr $LR --seed $SEED --slots $SLOTS --out $OUT"
[ "${REPLICA_READS:-0}" = 1 ] && COMMON="$COMMON --replica-reads"
[ "$MODE" = backup ] && COMMON="$COMMON --backup ${BACKUP:-1}"
[ "$MODE" = ssp ] && COMMON="$COMMON --ssp-bound ${SSP_BOUND:-3}"
[ -n "${DATA:-}" ] && COMMON="$COMMON --data $DATA"
WINDOWS=""
[ "${GRANT_WINDOWS:-0}" = 1 ] && WINDOWS="--grant-windows"  # server, replica and (gradlane mode) aggregator
REPLICA_AT=""; [ "$REPLICA" = 1 ] && REPLICA_AT="--replica $ADDR1:7801"

echo "== $MODE$([ "$STRAGGLER" = 1 ] && echo " (worker $WORKERS a straggler on host 3)"): $WORKERS workers x $STEPS steps, $MODEL, batch $BATCH, lr $LR$([ "$MODE" = gradlane ] && echo ", tau $TAU")$([ "$AGGREGATE" = 1 ] && echo ", aggregator on host 2")$([ "$MODE" = aggregate ] && echo ", groups of $GROUP on host 2")$([ "$REPLICA" = 1 ] && echo ", replica on host 1")"
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
# Its command goes in NAME.cmd, an argument a line, for a fault that restarts it.
role() {
  name=$1; shift
  printf '%s\n' "$@" > "$OUT/$name.cmd"
  ( sh -c 'echo $$ > "$0"; exec "$@"' "$OUT/$name.pid" "$@" > "$OUT/$name.log" 2>&1
    rc=$?; echo "$rc $(date +%s.%N)" > "$OUT/$name.exit"; exit $rc ) &
}
PIDS=""
SERVER_PEERS=""; REPLICA_PEERS=""; WORKER_TO=""
if [ "$MODE" = aggregate ]; then  # workers pull from the server; only the aggregator mirrors
  # The workers stay connected to the replica too: they mirror nothing while the aggregator
  # lives, and mirror their direct pushes if it dies (else the replica waits for each of them).
  SERVER_PEERS="--peers $((WORKERS + 1))"; REPLICA_PEERS="--peers $((WORKERS + 1))"; WORKER_TO="--aggregator $ADDR2:7802"
  role aggregator "$TRAIN" aggregator $COMMON --device "$DEV2" --port 7802 --id $((WORKERS + 1)) --server "$ADDR0:7800" $REPLICA_AT \
           --group "$GROUP"
  G=$!
fi
host_of() {  # worker I's host: the straggler alone on host 3, odd ids on host 2, even on host 1
  if [ "$STRAGGLER" = 1 ] && [ "$1" -eq "$WORKERS" ]; then echo 3; elif [ $(($1 % 2)) -eq 1 ]; then echo 2; else echo 1; fi
}
# Scheduler endpoints (gradlane mode): the server 0, the aggregator 4, worker I 100 + I — each
# worker its own NIC, as on a cluster (here co-located workers share their host's unshaped link).
if [ "$MODE" = gradlane ]; then
  BOUND=$([ "$REPLICA" = 1 ] && echo "$SLOTS" || echo 0)
  A_EXTRA=""; [ "$AGGREGATE" = 1 ] && A_EXTRA="--endpoint 4 --aggregator 1:4"
  [ "$AGGREGATE" = 1 ] && [ "${EAGER:-1}" = 1 ] && A_EXTRA="$A_EXTRA --aggregate-eagerly --relay-slower-than ${RELAY:-2}"
  [ -n "${SERVER_RATE:-}" ] && A_EXTRA="$A_EXTRA --link-rate 0:in:$SERVER_RATE"
  A_EXTRA="$A_EXTRA --ingress-sharing ${INGRESS:-exclusive}"
  B_EXTRA=""; i=1
  # Workers and the aggregator write each update to the replica too, unless the replica READs it.
  if [ "$REPLICA" = 1 ] && [ "${REPLICA_READS:-0}" != 1 ]; then A_EXTRA="$A_EXTRA --writers-mirror"; B_EXTRA="--writers-mirror"; fi
  # The replica (job 1, gradlane_train's default) runs on host 1: if it is promoted, gradlaned B
  # takes the server's sequence over.
  [ "$REPLICA" = 1 ] && B_EXTRA="$B_EXTRA --standby 0:1"
  while [ $i -le "$WORKERS" ]; do
    if [ "$(host_of $i)" = 1 ]; then B_EXTRA="$B_EXTRA --endpoint $((100 + i))"; else A_EXTRA="$A_EXTRA --endpoint $((100 + i))"; fi
    i=$((i + 1))
  done
  # As roles: a fault can target them (kill:gradlaned-a), and their exits are recorded.
  role gradlaned-a "$D" $KEY --foreground --shm-name /gradlane-train-a --device "$DEV0" --endpoint 0 $A_EXTRA --listen-port 7600 \
       --expect-peers 1 --staleness-bound "$TAU" --replica-bound "$BOUND" --schedule-log "$OUT/schedule.jsonl"
  role gradlaned-b "$D" $KEY --foreground --shm-name /gradlane-train-b --device "$DEV1" --endpoint 1 $B_EXTRA --listen-port 7601 \
       --peer "$ADDR0:7600" --staleness-bound "$TAU" --replica-bound "$BOUND" --ingress-sharing "${INGRESS:-exclusive}"
fi
sidecar() {  # HOST ENDPOINT: the options that attach a role on that host to its gradlaned
  [ "$MODE" = gradlane ] || return 0
  if [ "$1" = 1 ]; then echo "--sidecar /gradlane-train-b --endpoint $2"; else echo "--sidecar /gradlane-train-a --endpoint $2"; fi
}
if [ "$AGGREGATE" = 1 ]; then  # workers mirror their direct grants; the aggregator its sums
  SERVER_PEERS="--peers $((WORKERS + 1))"; REPLICA_PEERS="--peers $((WORKERS + 1))"
  WORKER_TO="--aggregator $ADDR2:7802 --aggregator-endpoint 4"
  role aggregator "$TRAIN" aggregator $COMMON --device "$DEV2" --port 7802 --id $((WORKERS + 1)) --server "$ADDR0:7800" $REPLICA_AT \
           $WINDOWS $(sidecar 2 4)
  G=$!
fi
if [ "$REPLICA" = 1 ]; then
  role replica "$TRAIN" replica $COMMON --device "$DEV1" --port 7801 $REPLICA_PEERS $WINDOWS $(sidecar 1 0)
  R=$!
fi
role server "$TRAIN" server $COMMON --device "$DEV0" --port 7800 $REPLICA_AT $SERVER_PEERS $WINDOWS $(sidecar 0 0)
S=$!
[ -n "${FAULT:-}" ] || { tail -n +1 -F "$OUT/server.log" 2>/dev/null & TAIL=$!; }  # the progress lines, as before
i=1
while [ $i -le "$WORKERS" ]; do
  host=$(host_of $i)
  case $host in 1) dev=$DEV1 ;; 2) dev=$DEV2 ;; *) dev=$DEV3 ;; esac
  role worker$i "$TRAIN" worker $COMMON --device "$dev" --id $i --server "$ADDR0:7800" $REPLICA_AT $WORKER_TO --steps "$STEPS" \
           --batch "$BATCH" $(sidecar "$host" $((100 + i))) --server-endpoint 0 $([ "${SHARD:-0}" = 1 ] && echo --shard)
  PIDS="$PIDS $!"
  i=$((i + 1))
done
INJECTOR=""
if [ -n "${FAULT:-}" ]; then
  sh "$(dirname "$0")/../tests/faults/inject-fault.sh" "$OUT" "$FAULT" > "$OUT/fault.log" 2>&1 &
  INJECTOR=$!
fi
failed=0
for p in $PIDS; do wait "$p" || failed=1; done
{ [ "$MODE" = aggregate ] || [ "$AGGREGATE" = 1 ]; } && { wait $G || failed=1; }
wait $S || failed=1
[ -n "${TAIL:-}" ] && { sleep 0.2; kill $TAIL 2>/dev/null; }
printf '{"before":{%s},"after":{%s}}\n' "$(echo "$BYTES_BEFORE" | sed 's/,$//')" "$(link_bytes | sed 's/,$//')" > "$OUT/link-bytes.json"
[ "$REPLICA" = 1 ] && { wait $R || failed=1; }
if [ "$MODE" = gradlane ]; then  # the daemons themselves (their pids), then their wrappers
  for d in gradlaned-a gradlaned-b; do kill -TERM "$(cat "$OUT/$d.pid")" 2>/dev/null; done
  wait
fi
[ -n "$INJECTOR" ] && wait $INJECTOR
[ $failed = 0 ] || { echo "a role failed:"; tail -n 3 "$OUT"/*.log; }
if [ "${SCHEDULE:-0}" = 1 ] && [ "$MODE" = gradlane ]; then
  python3 "$(dirname "$0")/../examples/print_schedule.py" "$OUT/schedule.jsonl"
fi
if [ "$REPLICA" = 1 ]; then
  if cmp -s "$OUT/server.model" "$OUT/replica.model"; then echo "server and replica models: bitwise equal"
  else echo "server and replica models: DIFFERENT"; failed=1; fi
fi
exit $failed
