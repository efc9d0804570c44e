#!/usr/bin/env bash
# Jobs sharing hosts (the multi-tenant case, MLNet's flow prioritization): does serving the
# job with the least work left first finish jobs sooner than sharing the link per flow, per job,
# or by a fixed priority, and what does it cost the long job? perf/train/tenants-job.sh runs
# one trial (hosts, jobs and modes are described there); this runs each variant for each seed,
# every trial in a fresh VM, and writes the table and a plot:
#   bash perf/train/tenants.sh [BUILD_DIR] [SEEDS="1 2 3"] [RATE=1mbit] [JOBS=2]
#        [VARIANTS="gradlane fifo undeclared"] [RESULTS=perf/results/train-tenants]
#        [RUNS=out/train-tenants/runs]
# Variants: gradlane (declared work left), undeclared (gradlane, nothing declared: the NIC
# compares the bytes each job has queued), fifo (no sidecar: the link shares itself per flow),
# fair (gradlaned shares each NIC per job: equal bytes), priority (gradlaned, strict priority,
# the least total work first), net-fair and net-priority (no sidecar: the shaped link itself
# queues by job, deficit round robin or strict priority, from the DSCP each job's packets carry).
# Extra NAME=VALUE settings (JOBS, LONG_STEPS, SHORT_STEPS, MEDIUM_STEPS, LONG_WORKERS,
# SHORT_WORKERS, MEDIUM_WORKERS, PRIORITY, LR, BATCH, TAU) go to every trial. Writes RESULTS/results.md (headed by the command and the commit), results.json,
# jct.png, command.txt, and each trial's raw run to RUNS/<variant>-seed<N>/ (ignored by git).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=build
if [[ $# -gt 0 && $1 != *=* ]]; then BUILD=$1; shift; fi
BUILD=$(cd "$BUILD" && pwd)
SEEDS="1 2 3" RATE=1mbit VARIANTS="gradlane fifo undeclared" RESULTS=$ROOT/perf/results/train-tenants RUNS=''
JOB=()
for setting in "$@"; do
  case $setting in
    SEEDS=*|RATE=*|VARIANTS=*|RESULTS=*|RUNS=*) declare "$setting" ;;
    JOBS=*|LONG_STEPS=*|SHORT_STEPS=*|MEDIUM_STEPS=*|LONG_WORKERS=*|SHORT_WORKERS=*|MEDIUM_WORKERS=*|PRIORITY=*|\
    LR=*|BATCH=*|TAU=*) JOB+=("$setting") ;;
    *) echo "tenants.sh: settings are SEEDS, RATE, VARIANTS, RESULTS, RUNS and the job's (see the top); got '$setting'" >&2
       exit 2 ;;
  esac
done
. "$ROOT/ci/softroce/raw-runs.sh"
[[ -n $RUNS ]] || RUNS=$(raw_runs_dir "$ROOT" "$RESULTS")
mkdir -p "$RESULTS" "$RUNS"
RESULTS=$(cd "$RESULTS" && pwd)
RUNS=$(cd "$RUNS" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
{ printf 'bash perf/train/tenants.sh'; printf ' %q' "$@"; printf '\n'; } > "$RESULTS/command.txt"
failed=0
for seed in $SEEDS; do
  for variant in $VARIANTS; do  # interleaved per seed: a drift of the machine hits every variant alike
    case $variant in
      gradlane) settings=(MODE=gradlane) ;;
      undeclared) settings=(MODE=gradlane DECLARE=0) ;;
      fifo) settings=(MODE=fifo) ;;
      fair) settings=(MODE=gradlane SHARING=fair) ;;
      priority) settings=(MODE=gradlane SHARING=priority) ;;
      net-fair) settings=(MODE=fifo NET=fair) ;;
      net-priority) settings=(MODE=fifo NET=priority) ;;
      *) echo "tenants.sh: unknown variant '$variant' (gradlane, undeclared, fifo, fair, priority, net-fair," \
              "net-priority)" >&2; exit 2 ;;
    esac
    name=$variant-seed$seed
    echo "== $name"
    if ! SOFTROCE_OUT=$TMP bash "$ROOT/ci/softroce.sh" --hosts 3 --shape "1:$RATE:out" --shape "2:$RATE:out" -- \
         sh "$HERE/tenants-job.sh" "$BUILD" "${settings[@]}" SEED="$seed" RATE="$RATE" NAME="$name" \
         "${JOB[@]}"; then
      echo "tenants.sh: $name failed (its logs: $RUNS/$name)" >&2
      failed=1
    fi
    rm -rf "$RUNS/$name"
    cp -r "$TMP/tenants-$name" "$RUNS/$name"
    for dir in "$RUNS/$name"/job*; do  # the final model's accuracy on the full test set, outside the emulator
      [[ -f $dir/snapshots.bin ]] && "$BUILD/trainer/gradlane_train" evaluate --out "$dir" --target 0.7 > "$dir/evaluate.txt"
    done
  done
done
python3 "$HERE/tenants_table.py" "$RESULTS" "$RUNS"
exit $failed
