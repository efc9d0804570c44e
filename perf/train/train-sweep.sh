#!/usr/bin/env bash
# The training comparison over Soft-RoCE: gradlane vs fifo vs sync vs aggregate, without and
# with a straggler, on an ingress-bound server (SERVER_RATE limits what enters the server's host); one job per (case, mode, seed), each in a fresh VM.
#   bash perf/train/train-sweep.sh [BUILD_DIR] [SEEDS="1 2 3"] [SERVER_RATE=4mbit] [STEPS=150] [WORKERS=4]
#        [STRAGGLERS="0 1"] [MODES="gradlane fifo sync aggregate"] [REPLICA=1] [REPLICA_READS=0]
#        [TAU=N] (gradlaned's staleness bound; default 2 x WORKERS)
# REPLICA=0 runs without the replica; REPLICA_READS=1 has it READ each update from the server's
# slot instead of every writer mirroring it (trainer/train-job.sh).
# Writes a table (results.md, headed by the commands and the commit), the raw summaries
# (results.json) and command.txt into RESULTS=perf/results/train-softroce (or the RESULTS= given),
# and every run's directory and log into RUNS=out/train-softroce/runs (ignored by git; see below);
# runs already there are kept, so seeds can be added by later invocations (command.txt lists them all).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=build
if [[ $# -gt 0 && $1 != *=* ]]; then BUILD=$1; shift; fi
SEEDS="1" STRAGGLERS="0 1" SERVER_RATE=4mbit STEPS=150 WORKERS=4 RESULTS=$ROOT/perf/results/train-softroce MODES="gradlane fifo sync aggregate"
REPLICA=1 REPLICA_READS=0 RUNS=''
for setting in "$@"; do
  case $setting in
    SEEDS=*|STRAGGLERS=*|SERVER_RATE=*|STEPS=*|WORKERS=*|RESULTS=*|RUNS=*|MODES=*|REPLICA=*|REPLICA_READS=*|TAU=*) declare "$setting" ;;
    *) echo "train-sweep.sh: unknown setting '$setting'" >&2; exit 2 ;;
  esac
done
. "$ROOT/ci/softroce/raw-runs.sh"
[[ -n $RUNS ]] || RUNS=$(raw_runs_dir "$ROOT" "$RESULTS")
mkdir -p "$RESULTS" "$RUNS"
printf '%s\n' "bash perf/train/train-sweep.sh $*" >> "$RESULTS/command.txt"
for straggler in $STRAGGLERS; do
  for seed in $SEEDS; do
    for mode in $MODES; do
      run=$RUNS/straggler$straggler-$mode-seed$seed
      rm -rf "$run"
      bash "$ROOT/trainer/train.sh" "$BUILD" MODE="$mode" SEED="$seed" STEPS="$STEPS" WORKERS="$WORKERS" \
           SERVER_RATE="$SERVER_RATE" STRAGGLER="$straggler" REPLICA="$REPLICA" REPLICA_READS="$REPLICA_READS" \
           ${TAU:+TAU="$TAU"} OUT_DIR="$run" > "$run.log" 2>&1 || true
      tail -n 4 "$run.log"
    done
  done
done
python3 "$HERE/train_table.py" "$RESULTS" "$RUNS"
