#!/usr/bin/env bash
# The main job: one data-parallel training run on Fashion-MNIST over gradlane, on emulated
# Soft-RoCE hosts, then the recorded models evaluated on the full test set and a summary.
#   bash trainer/train.sh [BUILD_DIR] [NAME=VALUE ...]
# Settings: those of trainer/train-job.sh (MODE=gradlane|fifo|sync|aggregate|backup|ssp, BACKUP, SSP_BOUND, MODEL, WORKERS,
# STEPS, LR, BATCH, SEED, TAU, TARGET, SCHEDULE, REPLICA, SLOTS, STRAGGLER, GROUP) and, for the network:
#   SERVER_RATE  the server host's ingress (tc rate, e.g. 20mbit; default: unshaped): what the
#                workers push; the model's READ responses leave unshaped
#   SERVER_SHAPE=both  shape the server's link in both directions instead (pulls too)
#   STRAGGLER=1  the last worker alone on host 3, its link at STRAGGLER_RATE
#   STRAGGLER_RATE (default: a quarter of SERVER_RATE, or 10mbit)
#   SPLIT=validation  evaluate the recorded models on the validation split (the last 10,000
#                training images, never trained on) instead of the test set: for tuning
# Results in OUT_DIR=... (default: a new directory under /tmp, named at the end).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
BUILD=$ROOT/build
if [[ $# -gt 0 && $1 != *=* ]]; then BUILD=$1; shift; fi
JOB_SETTINGS=() MODE=gradlane MODEL=softmax TARGET=0.75 SPLIT=test SERVER_RATE="" SERVER_SHAPE=in STRAGGLER=0 STRAGGLER_RATE="" OUT_DIR=""
for setting in "$@"; do
  case $setting in
    SERVER_RATE=*) SERVER_RATE=${setting#*=} ;;
    SERVER_SHAPE=*) SERVER_SHAPE=${setting#*=}
                    [[ $SERVER_SHAPE == in || $SERVER_SHAPE == both ]] || { echo "train.sh: SERVER_SHAPE is in or both" >&2; exit 2; } ;;
    STRAGGLER_RATE=*) STRAGGLER_RATE=${setting#*=} ;;
    OUT_DIR=*) OUT_DIR=${setting#*=} ;;
    SPLIT=*) SPLIT=${setting#*=}
             [[ $SPLIT == test || $SPLIT == validation ]] || { echo "train.sh: SPLIT is test or validation" >&2; exit 2; } ;;
    *=*) JOB_SETTINGS+=("$setting")
         case $setting in MODE=*) MODE=${setting#*=} ;; MODEL=*) MODEL=${setting#*=} ;;
                          TARGET=*) TARGET=${setting#*=} ;; STRAGGLER=*) STRAGGLER=${setting#*=} ;; esac ;;
    *) echo "train.sh: settings are NAME=VALUE, got '$setting'" >&2; exit 2 ;;
  esac
done
# On a fresh clone: the packages, then only the two programs the job runs (a few minutes).
if [[ ! -x $BUILD/trainer/gradlane_train || ! -x $BUILD/sidecar/daemon/gradlaned ]]; then
  echo "train.sh: building gradlane_train and gradlaned in $BUILD" >&2
  bash "$ROOT/ci/install-deps.sh"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
  cmake --build "$BUILD" -j"$(nproc)" --target gradlane_train gradlaned >&2
fi
BUILD=$(cd "$BUILD" && pwd)
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/gradlane-train.XXXXXX)}
mkdir -p "$OUT_DIR"
harness=(--hosts 3)
[[ -n $SERVER_RATE ]] && harness+=(--shape "0:$SERVER_RATE$([[ $SERVER_SHAPE == in ]] && echo :in)") && JOB_SETTINGS+=("SERVER_RATE=$SERVER_RATE")
if [[ $STRAGGLER == 1 ]]; then
  if [[ -z $STRAGGLER_RATE ]]; then
    if [[ $SERVER_RATE =~ ^([0-9]+)mbit$ ]]; then STRAGGLER_RATE="$((BASH_REMATCH[1] * 1000 / 4))kbit"; else STRAGGLER_RATE=10mbit; fi
  fi
  harness=(--hosts 4 "${harness[@]:2}" --shape "3:$STRAGGLER_RATE")
fi
echo "network: ${harness[*]}"
rc=0
SOFTROCE_OUT=$OUT_DIR bash "$ROOT/ci/softroce.sh" "${harness[@]}" -- sh "$HERE/train-job.sh" "$BUILD" "${JOB_SETTINGS[@]}" || rc=$?
RUN=$OUT_DIR/train-$MODE
if [[ -f $RUN/snapshots.bin ]]; then
  "$BUILD/trainer/gradlane_train" evaluate --model "$MODEL" --out "$RUN" --target "$TARGET" --split "$SPLIT"
  python3 "$HERE/train_summary.py" "$RUN"
  # Every setting that made this run, for the results folder.
  printf '%s\n' "bash trainer/train.sh $*" "network: ${harness[*]}" > "$RUN/command.txt"
fi
echo "results: $RUN"
exit $rc
