#!/bin/sh
# Two or three training jobs sharing three emulated hosts (perf/train/tenants.sh runs it): a
# long job (id 1: LONG_WORKERS workers), a short one (id 2: SHORT_WORKERS) and with JOBS=3 a
# medium one (id 3: MEDIUM_WORKERS), softmax regression on Fashion-MNIST. Worker w of each job
# runs on host 1 + (w - 1) % 2, and what leaves a worker host is shaped (the harness's
# --shape I:RATE:out): the jobs' pushes compete for it.
#   host 0: every server (job j on port 7790 + 10 j, endpoint j - 1), gradlaned
#   host 1: odd workers of each job (NIC endpoint 101)   host 2: even workers (102)
# MODE=gradlane: every role attaches to the one gradlaned (no --endpoint: it schedules every
#   receiver itself), told the worker hosts' egress rate; with DECLARE=1 each push declares its
#   job's work left, and the NIC serves the job with less left first (MLNet's prioritization);
#   DECLARE=0: nothing declared, queued bytes tie and the tie goes to the lower job id, job 1.
#   SHARING=fair or priority: gradlaned shares each NIC by a baseline rule instead (--job-sharing):
#   equal bytes per backlogged job, or strict priority in PRIORITY's order (default: the least
#   total work first, 2,1 or 2,3,1: the order an operator who knows every job's length would set).
# MODE=fifo: no sidecar, every push at once: the link shares itself between the jobs (per-flow
#   fair sharing, the baseline). With NET=fair or priority the worker hosts' shaped links queue
#   by job instead, as a RoCE fabric configured per traffic class does: each job's workers mark
#   their packets with DSCP = job id (GRADLANE_TOS), and under the same rate the link runs
#   deficit round robin between the jobs (fair: equal bytes per job, whatever its flows) or
#   strict priority in PRIORITY's order (priority).
#   bash ci/softroce.sh --hosts 3 --shape 1:2mbit:out --shape 2:2mbit:out -- \
#     sh perf/train/tenants-job.sh build MODE=gradlane SEED=1 RATE=2mbit
# Settings: MODE, DECLARE (1), SHARING (shortest-remaining), NET, PRIORITY, JOBS (2), SEED (1),
#   LONG_WORKERS (4), LONG_STEPS (60), SHORT_WORKERS (2), SHORT_STEPS (20), MEDIUM_WORKERS (2),
#   MEDIUM_STEPS (40) per worker, LR (0.05),
#   BATCH (64), RATE (what the harness shaped, told to gradlaned), TAU (gradlaned's, 2 x LONG_WORKERS),
#   NAME (the results folder under $GRADLANE_OUT_DIR: tenants-NAME; default MODE-seedSEED).
# Each job's server writes its files in jobJ/ (stats.json with its training start as
# a Unix time, snapshots for the offline evaluation); every role's exit goes in NAME.exit.
set -u
BUILD=${1:?usage: tenants-job.sh BUILD_DIR [NAME=VALUE ...]}
shift
for setting in "$@"; do
  case $setting in
    MODE=*|DECLARE=*|SHARING=*|NET=*|PRIORITY=*|JOBS=*|SEED=*|LONG_STEPS=*|LONG_WORKERS=*|SHORT_WORKERS=*|SHORT_STEPS=*|\
    MEDIUM_WORKERS=*|MEDIUM_STEPS=*|LR=*|BATCH=*|RATE=*|TAU=*|NAME=*) export "$setting" ;;
    *) echo "tenants-job.sh: unknown setting '$setting' (see the comment at the top)" >&2; exit 2 ;;
  esac
done
MODE=${MODE:-gradlane}; DECLARE=${DECLARE:-1}; SEED=${SEED:-1}; LONG_STEPS=${LONG_STEPS:-60}
SHORT_STEPS=${SHORT_STEPS:-20}; LONG_WORKERS=${LONG_WORKERS:-4}; SHORT_WORKERS=${SHORT_WORKERS:-2}
MEDIUM_WORKERS=${MEDIUM_WORKERS:-2}; MEDIUM_STEPS=${MEDIUM_STEPS:-40}; JOBS=${JOBS:-2}
SHARING=${SHARING:-shortest-remaining}
LR=${LR:-0.05}; BATCH=${BATCH:-64}; TAU=${TAU:-$((2 * LONG_WORKERS))}
case $JOBS in 2) PRIORITY=${PRIORITY:-2,1} ;; 3) PRIORITY=${PRIORITY:-2,3,1} ;;
  *) echo "tenants-job.sh: JOBS is 2 or 3" >&2; exit 2 ;; esac
case $SHARING in shortest-remaining|fair|priority) ;;
  *) echo "tenants-job.sh: SHARING is shortest-remaining, fair or priority" >&2; exit 2 ;; esac
NET=${NET:-}
case $MODE/$NET in */|fifo/fair|fifo/priority) ;;
  *) echo "tenants-job.sh: NET is fair or priority, with MODE=fifo" >&2; exit 2 ;; esac
NAME=${NAME:-$MODE-seed$SEED}
case $MODE in gradlane|fifo) ;; *) echo "tenants-job.sh: MODE is gradlane or fifo" >&2; exit 2 ;; esac
OUT=${GRADLANE_OUT_DIR:-/tmp}/tenants-$NAME
export GRADLANE_SIDECAR_TIMEOUT_MS=${GRADLANE_SIDECAR_TIMEOUT_MS:-3000}
set -- $GRADLANE_HOSTS
DEV0=${1%%,*}; ADDR0=${1#*,}; DEV1=${2%%,*}; DEV2=${3%%,*}
TRAIN="$BUILD/trainer/gradlane_train"
rm -rf "$OUT"; for job in $(seq 1 "$JOBS"); do mkdir -p "$OUT/job$job"; done
. "$(dirname "$0")/../../ci/softroce/job-key.sh"; make_job_key "$OUT"
echo "== tenants, $MODE$([ "$MODE" = gradlane ] && echo " (sharing $SHARING, declared work left: $DECLARE, tau $TAU)"): job 1 $LONG_WORKERS x $LONG_STEPS steps, job 2 $SHORT_WORKERS x $SHORT_STEPS$([ "$JOBS" = 3 ] && echo ", job 3 $MEDIUM_WORKERS x $MEDIUM_STEPS"), seed $SEED"

role() {  # NAME CMD...: in the background, output in NAME.log, "STATUS UNIX_TIME" in NAME.exit
  name=$1; shift
  ( "$@" > "$OUT/$name.log" 2>&1; rc=$?; echo "$rc $(date +%s.%N)" > "$OUT/$name.exit"; exit $rc ) &
}
SHM=/gradlane-tenants
if [ -n "$NET" ]; then
  # Replaces the harness's tbf on each worker host's egress by the same tbf over classes by
  # DSCP (the IP header's dsfield is DSCP << 2): DRR with a class per job, or prio with a band
  # per job in PRIORITY's order; anything unmarked (acks, connects) gets a class of its own.
  # Each class queues at most 40 packets (~45 kB), as the harness's tbf alone holds ~50 kB:
  # past it packets drop and RC retransmits, instead of waiting seconds in a deep queue.
  batch=""
  for h in 1 2; do
    batch="${batch}qdisc del dev h$h root
qdisc add dev h$h root handle 1: tbf rate ${RATE:?NET needs RATE} burst 32kb latency 400ms
"
    if [ "$NET" = fair ]; then
      batch="${batch}qdisc add dev h$h parent 1:1 handle 10: drr
class add dev h$h parent 10: classid 10:99 drr
qdisc add dev h$h parent 10:99 pfifo limit 40
"
      for job in $(seq 1 "$JOBS"); do
        batch="${batch}class add dev h$h parent 10: classid 10:$job drr
qdisc add dev h$h parent 10:$job pfifo limit 40
filter add dev h$h parent 10: protocol ip prio 1 u32 match ip dsfield $((job * 4)) 0xfc flowid 10:$job
"
      done
      batch="${batch}filter add dev h$h parent 10: protocol all prio 2 u32 match u32 0 0 flowid 10:99
"
    else
      bands=$((JOBS + 1)) band=1
      batch="${batch}qdisc add dev h$h parent 1:1 handle 10: prio bands $bands priomap $(printf "$JOBS %.0s" $(seq 16))
"
      for b in $(seq 1 "$bands"); do batch="${batch}qdisc add dev h$h parent 10:$b pfifo limit 40
"; done
      for job in $(echo "$PRIORITY" | tr , ' '); do
        batch="${batch}filter add dev h$h parent 10: protocol ip prio 1 u32 match ip dsfield $((job * 4)) 0xfc flowid 10:$band
"
        band=$((band + 1))
      done
    fi
  done
  printf '%s' "$batch" | tc -batch - || { echo "tenants-job.sh: tc refused the classes by DSCP" >&2; exit 1; }
fi
if [ "$MODE" = gradlane ]; then
  RATES=""; [ -n "${RATE:-}" ] && RATES="--link-rate 101:out:$RATE --link-rate 102:out:$RATE"
  SHARES="--job-sharing $SHARING"; [ "$SHARING" = priority ] && SHARES="$SHARES --job-priority $PRIORITY"
  "$BUILD/sidecar/daemon/gradlaned" --foreground --shm-name $SHM --device "$DEV0" --staleness-bound "$TAU" \
      --replica-bound 0 $RATES $SHARES --schedule-log "$OUT/schedule.jsonl" > "$OUT/gradlaned.log" 2>&1 &
  DAEMON=$!
fi
attach() {  # ENDPOINT JOB: the options that attach a role to gradlaned
  [ "$MODE" = gradlane ] && echo "--sidecar $SHM --endpoint $1 --job $2"
}
SERVERS="" WORKERS_PIDS=""
for job in $(seq 1 "$JOBS"); do
  port=$((7790 + 10 * job)); steps=$LONG_STEPS; workers=$LONG_WORKERS
  [ $job = 2 ] && { steps=$SHORT_STEPS; workers=$SHORT_WORKERS; }
  [ $job = 3 ] && { steps=$MEDIUM_STEPS; workers=$MEDIUM_WORKERS; }
  common="--mode $MODE --workers $workers --lr $LR --seed $SEED --out $OUT/job$job"
  role job$job-server "$TRAIN" server $common --device "$DEV0" --port $port $(attach $((job - 1)) $job)
  SERVERS="$SERVERS $!"
  # DSCP = job id. A job behind another in a class queue waits for seconds (strict priority:
  # as long as the other sends), so its connections get the long RC timeouts an operator of
  # such a network sets (4.3 s, 7 retries) instead of gradlane's 1 s, 1 retry.
  marked=""; [ -n "$NET" ] && marked="env GRADLANE_TOS=$((job * 4)) GRADLANE_ACK_TIMEOUT=20 GRADLANE_RETRY_COUNT=7"
  w=1
  while [ $w -le $workers ]; do
    host=$((1 + (w - 1) % 2)); dev=$DEV1; [ $host = 2 ] && dev=$DEV2
    role job$job-worker$w $marked "$TRAIN" worker $common --device "$dev" --id $w --server "$ADDR0:$port" --steps "$steps" \
         --batch "$BATCH" $(attach $((100 + host)) $job) --server-endpoint $((job - 1)) \
         $([ "$MODE" = gradlane ] && [ "$DECLARE" = 0 ] && echo "--declare-remaining false")
    WORKERS_PIDS="$WORKERS_PIDS $!"
    w=$((w + 1))
  done
done
failed=0
for p in $WORKERS_PIDS $SERVERS; do wait "$p" || failed=1; done
if [ "$MODE" = gradlane ]; then kill -TERM $DAEMON 2>/dev/null; wait $DAEMON; fi
# What each class carried: a job whose packets were not marked shows in the unmarked class.
[ -n "$NET" ] && tc -s class show dev h1 > "$OUT/classes-h1.txt"
[ $failed = 0 ] || { echo "a role failed:"; tail -n 3 "$OUT"/*.log; exit 1; }
for job in $(seq 1 "$JOBS"); do
  printf 'job %s: ' $job; tail -n 1 "$OUT/job$job-server.log"
done
