#!/usr/bin/env bash
# Fault injection during training over Soft-RoCE: for each fault, a fresh
# set of emulated hosts runs a short direct-mode training job (trainer/train-job.sh: server,
# replica, WORKERS workers; aggregate mode for the aggregator's faults), one fault is injected
# at a seeded version of the server (tests/faults/inject-fault.sh), and the run is checked
# (tests/faults/fault_row.py): finished or a clear error within 5 s, nothing hung, server and
# replica bitwise equal at equal versions, no acknowledged update lost.
#   bash tests/faults/run-faults.sh [BUILD_DIR] [SEED=1] [FAULTS="kill:server kill:replica ..."]
#        [WORKERS=3] [STEPS=150] [OUT=perf/results/train-faults] [RUNS=out/train-faults/runs]
#        [GRANT_WINDOWS=1] [AT=VERSION: every fault at this server version, to rerun a row]
# Faults (KIND:TARGET): kill:ROLE, stop:ROLE (SIGSTOP 6 s, SIGCONT), restart:workerI (SIGKILL,
# started again 1 s later from its next step: it must rejoin), link:HOST (down 4 s, up),
# netem:HOST (loss 10% delay 20ms, 5 s); ROLE = server | replica | workerI | aggregator;
# HOST = 0 (server) | 1 (replica, even workers) | 2 (odd workers, aggregator); ROLE also
# gradlaned-a (host 0's sidecar: the server's, host 2's workers', the aggregator's) or
# gradlaned-b (host 1's), run in gradlane mode. FAULT@MODE runs a fault in another mode:
# kill:server@gradlane (the replica's sidecar takes the server's sequence over).
# Writes OUT/table.md and OUT/table.json (headed by the command and the commit) and each fault's
# raw run to RUNS/ (default out/train-faults/runs, ignored by git; OUT outside perf/results keeps
# them in OUT/runs); exits 1 if a fault was not survived. A fault whose VM failed under it (the
# harness timed out or the guest kernel locked up, so the injector left no record) runs again,
# up to twice; its row says so, and the earlier runs are kept in RUNS/first-runs.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=build
if [[ $# -gt 0 && $1 != *=* ]]; then BUILD=$1; shift; fi
BUILD=$(cd "$BUILD" && pwd)
SEED=1 WORKERS=3 STEPS=150 OUT=$ROOT/perf/results/train-faults GRANT_WINDOWS=0 RUNS='' AT=''
FAULTS="kill:server kill:server@gradlane kill:replica kill:worker1 restart:worker1 stop:worker2 link:2 link:0 netem:0 kill:aggregator stop:aggregator kill:gradlaned-a restart:gradlaned-a kill:gradlaned-b restart:gradlaned-b replace:server replace:server@gradlane restart:aggregator restart:aggregator@gradlane link:2@aggregate link:2@gradlane"
for setting in "$@"; do
  case $setting in
    SEED=*|FAULTS=*|WORKERS=*|STEPS=*|OUT=*|RUNS=*|GRANT_WINDOWS=*|AT=*) declare "$setting" ;;
    *) echo "run-faults.sh: settings are SEED, FAULTS, WORKERS, STEPS, OUT, RUNS, GRANT_WINDOWS, AT; got '$setting'" >&2; exit 2 ;;
  esac
done
[[ -x $BUILD/trainer/gradlane_train ]] || { echo "run-faults.sh: build $BUILD/trainer/gradlane_train first" >&2; exit 2; }
. "$ROOT/ci/softroce/raw-runs.sh"
[[ -n $RUNS ]] || RUNS=$(raw_runs_dir "$ROOT" "$OUT")
mkdir -p "$OUT" "$RUNS"
# The dataset decompressed once, here, outside the emulator: each of the job's processes would
# otherwise inflate it inside (seconds each, several at once), before every fault's run.
DATA=$BUILD/fashion-mnist
mkdir -p "$DATA"
for gz in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do
  plain=$DATA/$(basename "$gz" .gz)
  [[ -s $plain ]] || { gunzip -c "$gz" > "$plain.tmp" && mv "$plain.tmp" "$plain"; }
done
# show_tails DIR: what the harness, the injector and each role last said (the raw run stays).
show_tails() {
  for f in "$1/job.out" "$1"/*.log; do
    [[ -f $f ]] && { echo "    -- ${f##*/}"; tail -n 12 "$f" | cut -c1-300 | sed 's/^/       /'; }
  done
}
# run_fault NAME FAULT AT MODE STEPS FIRST_FAILURE: one fault on fresh emulated hosts; its
# raw run to RUNS/NAME with row.json (fault_row.py's verdict), the row in $row.
run_fault() {
  local name=$1 fault=$2 at=$3 mode=$4 steps=$5 first=$6 work rc=0
  work=$(mktemp -d /tmp/gradlane-faults.XXXXXX)
  echo "== $name: $fault at version ${at#v}, $mode, $WORKERS workers x $steps steps, seed $SEED${first:+ (run again)}"
  # softlockup_panic: a guest kernel that locks up ends its VM at once, saying so.
  SOFTROCE_OUT=$work SOFTROCE_TIMEOUT=${SOFTROCE_TIMEOUT:-600} SOFTROCE_APPEND="softlockup_panic=1 ${SOFTROCE_APPEND:-}" \
    nice -n 15 bash "$ROOT/ci/softroce.sh" --hosts 3 -- \
    sh "$ROOT/trainer/train-job.sh" "$BUILD" MODE="$mode" WORKERS="$WORKERS" STEPS="$steps" SEED="$SEED" \
    GRANT_WINDOWS="$GRANT_WINDOWS" DATA="$DATA" FAULT="$fault:$at" > "$work/job.out" 2>&1 || rc=$?
  local run=$work/train-$mode dest=$RUNS/$name
  rm -rf "$dest"; mkdir -p "$dest"
  cp "$work/job.out" "$dest/"
  # Everything but the snapshots (the model every 250 ms: large, and not what is checked here).
  [[ -d $run ]] && find "$run" -maxdepth 1 -type f ! -name snapshots.bin -exec cp {} "$dest/" \;
  rm -rf "$work"
  row=$(python3 "$HERE/fault_row.py" "$dest" | python3 -c '
import json, sys
r = json.load(sys.stdin)
rc, spec, mode, first = sys.argv[1:]
r.update(job_exit=int(rc), spec=spec, mode=mode)
if first:
    r.update(earlier_runs=first, outcome=r["outcome"] + " (run again; before: " + first + ")")
print(json.dumps(r))' "$rc" "$fault:$at" "$mode" "$first")
  echo "$row" > "$dest/row.json"
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("   ", "survived" if r["survived"] else "FAILED", "|", r["outcome"], "| lost", r["lost"], "| equal", r["equal"], "| hung", r["hung"], "|", "; ".join(r.get("problems", [])))' "$row"
  python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["survived"] else 1)' "$row" || show_tails "$dest"
}
RANDOM=$SEED  # the injection points: the same for the same SEED and FAULTS
n=0
for spec in $FAULTS; do
  n=$((n + 1))
  fault=${spec%@*}  # FAULT@MODE runs that fault in another mode (kill:server@gradlane)
  mode=fifo
  [[ $fault == *:aggregator ]] && mode=aggregate
  [[ $fault == *:gradlaned-* ]] && mode=gradlane
  [[ $spec == *@* ]] && mode=${spec#*@}
  # At a version of the server, not a time: the same point of the job however loaded the
  # machine. Mid-job, where the 1-4 s of earlier lists landed (v80-v440 of 450 pushes); in
  # aggregate mode a version holds WORKERS pushes.
  at=$((80 + RANDOM % 120))
  [[ $mode == aggregate ]] && at=$((at / WORKERS))
  at=v${AT:-$at}
  # A restarted worker loads the dataset again (~3 s in the emulator) before it connects: the
  # job must outlast that, or the others finish first and there is nothing left to rejoin.
  steps=$STEPS
  [[ $fault == restart:* || $fault == replace:* ]] && steps=$((2 * STEPS))
  name=$(printf '%02d-%s' "$n" "${spec//[:@]/-}")
  run_fault "$name" "$fault" "$at" "$mode" "$steps" ""
  # A run whose VM failed under it (the harness timed out, the guest kernel locked up: no
  # record from the injector, whose watchdog ends any role that hangs) says nothing of
  # gradlane: it runs again, up to twice, its row naming the earlier runs' failures (kept in
  # RUNS/first-runs). Linux 6.1's rxe can spin in its requester while a link is down.
  failures=""
  for again in 1 2; do
    harness=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("harness_failure") or "")' "$row")
    [[ -n $harness ]] || break
    failures="${failures:+$failures; }$harness"
    mkdir -p "$RUNS/first-runs"; rm -rf "$RUNS/first-runs/$name.$again"; mv "$RUNS/$name" "$RUNS/first-runs/$name.$again"
    run_fault "$name" "$fault" "$at" "$mode" "$steps" "$failures"
  done
done
python3 "$HERE/fault_table.py" "$OUT" "$RUNS" "bash tests/faults/run-faults.sh SEED=$SEED WORKERS=$WORKERS STEPS=$STEPS FAULTS=\"$FAULTS\""
