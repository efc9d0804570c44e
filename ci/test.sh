#!/usr/bin/env bash
# The project's test command (README, .ci/run): install dependencies, build, run the unit
# suite natively, the decoders' fuzz targets for a bounded minute (ci/fuzz.sh, its own Clang
# build), and the softroce suite over a real Soft-RoCE device (ci/softroce.sh boots a VM with
# rdma_rxe where the kernel has none), the unit and softroce suites again under ASan+UBSan and
# the sidecar's tests under TSan (ci/sanitizers.sh ci, their own build directories), then the layering and
# install checks, and the checkers of the experiment scripts (tests/scripts); and the fault
# list during training (tests/faults/run-faults.sh: each fault injected into a running job on
# fresh emulated hosts, one seed; the ten without a softroce twin, or GRADLANE_FAULTS). The last
# eleven lines are the summaries:
#   faults: N passed, M failed          (passed = survived, as fault_row.py checks it)
#   fuzz: N passed, M failed
#   asan-unit: N passed, M failed
#   asan-softroce: N passed, M failed
#   tsan-sidecar: N passed, M failed
#   layers: N passed, M failed
#   format: N passed, M failed         (ci/check-format.sh: the style of .clang-format)
#   scripts: N passed, M failed
#   install: N passed, M failed
#   unit: N passed, M failed
#   softroce: N passed, M failed
# Exits non-zero if anything failed or if a suite did not run.
#
# ci/test.sh --quick: the developer's loop, ~10 min with a warm build: build, the unit suite,
# the layer and format checks, and a Soft-RoCE smoke (the push example, the parameter-server
# example, two sidecars' granted slots, a failover), ending in four summaries (layers, format,
# unit, softroce-smoke).
set -euo pipefail

QUICK=0
case "${1:-}" in
  --quick) QUICK=1 ;;
  "") ;;
  *) echo "usage: ci/test.sh [--quick]" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${GRADLANE_BUILD_DIR:-$ROOT/build}
REPORTS=${GRADLANE_REPORTS:-$BUILD/test-reports}
JOBS=${JOBS:-$(nproc)}
FAULTS_SEED=${GRADLANE_FAULTS_SEED:-1}

bash "$ROOT/ci/install-deps.sh"

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADLANE_WERROR=ON ${GRADLANE_CMAKE_ARGS:-}
cmake --build "$BUILD" -j"$JOBS"

rm -rf "$REPORTS"
mkdir -p "$REPORTS/unit" "$REPORTS/softroce"

# Test executables follow one naming rule: gradlane_*_tests; those needing RDMA end in
# softroce_tests.
mapfile -t unit_bins < <(find "$BUILD/tests" -type f -perm -u+x -name 'gradlane_*_tests' ! -name '*softroce_tests' | sort)
mapfile -t softroce_bins < <(find "$BUILD/tests" -type f -perm -u+x -name '*softroce_tests' | sort)

echo "=== unit suite (native): ${#unit_bins[@]} executables"
for bin in "${unit_bins[@]}"; do
  echo "=== $(basename "$bin")"
  "$bin" --gtest_output="json:$REPORTS/unit/$(basename "$bin").json" || true
done

names() { for b in "$@"; do basename "$b"; done; }

if ((QUICK)); then
  smoke_filter=ReadmeExample.WorkerPushesAGradientTheServerSums:ReadmeExample.PsQuickstartRunsAsServerReplicaAndWorker
  smoke_filter+=:TwoSidecars.TransfersFollowTheReceiversGrantedOrderAndSlots
  smoke_filter+=:ShardRun.WhenTheServerIsKilledTheReplicaTakesOverWithinThreeSeconds
  smoke_bins=("$BUILD/tests/softroce/gradlane_softroce_tests" "$BUILD/tests/ps/gradlane_ps_softroce_tests"
              "$BUILD/tests/peer/gradlane_sidecar_softroce_tests")
  echo "=== softroce smoke (over rxe): $smoke_filter"
  SOFTROCE_OUT="$REPORTS/softroce" bash "$ROOT/ci/softroce.sh" --hosts 3 -- \
    sh "$ROOT/ci/softroce-suite.sh" --filter "$smoke_filter" "${smoke_bins[@]}" || true
  layers_ok=0; format_ok=0; unit_ok=0; smoke_ok=0
  python3 "$ROOT/ci/check-layers.py" "$ROOT" > "$REPORTS/layers.summary" || layers_ok=1
  bash "$ROOT/ci/check-format.sh" "$ROOT" > "$REPORTS/format.summary" || format_ok=1
  # shellcheck disable=SC2046
  python3 "$ROOT/ci/gtest_summary.py" unit $(names "${unit_bins[@]}") -- "$REPORTS/unit" > "$REPORTS/unit.summary" || unit_ok=1
  # shellcheck disable=SC2046
  python3 "$ROOT/ci/gtest_summary.py" softroce-smoke $(names "${smoke_bins[@]}") -- "$REPORTS/softroce" \
    > "$REPORTS/softroce.summary" || smoke_ok=1
  # Four tests, all four run: a filter that stopped matching must not pass as an empty smoke.
  grep -qE '^softroce-smoke: 4 passed, 0 failed$' "$REPORTS/softroce.summary" || smoke_ok=1
  cat "$REPORTS/layers.summary" "$REPORTS/format.summary" "$REPORTS/unit.summary" "$REPORTS/softroce.summary"
  exit $(( layers_ok | format_ok | unit_ok | smoke_ok ))
fi

echo "=== fuzz (libFuzzer, bounded): ci/fuzz.sh"
fuzz_ok=0
GRADLANE_FUZZ_BUILD_DIR=${GRADLANE_FUZZ_BUILD_DIR:-$BUILD-fuzz} bash "$ROOT/ci/fuzz.sh" 2>&1 | tee "$REPORTS/fuzz.log" || fuzz_ok=1
grep -E '^fuzz: [0-9]+ passed, [0-9]+ failed$' "$REPORTS/fuzz.log" | tail -1 > "$REPORTS/fuzz.summary" || true
if [[ ! -s $REPORTS/fuzz.summary ]]; then  # it died before its summary: count it as one failure
  echo "fuzz: 0 passed, 1 failed" > "$REPORTS/fuzz.summary"
  fuzz_ok=1
fi

echo "=== softroce suite (over rxe): ${#softroce_bins[@]} executables"
# Three emulated hosts: the single-host tests use the first, the sidecar tests all three.
SOFTROCE_OUT="$REPORTS/softroce" bash "$ROOT/ci/softroce.sh" --hosts 3 -- sh "$ROOT/ci/softroce-suite.sh" "${softroce_bins[@]}" || true

# The faults of the list that no softroce test injects into a process of its own: the others
# (kill:server, kill:server@gradlane, kill:worker1, restart:worker1, stop:worker2, link:0,
# kill:aggregator, restart:aggregator, replace:server, restart:gradlaned-a, link:2@aggregate)
# each have a twin in gradlane_ps_softroce_tests, run above and under ASan. The whole list:
# bash tests/faults/run-faults.sh (docs/testing.md).
CI_FAULTS="kill:replica link:2 netem:0 stop:aggregator kill:gradlaned-a kill:gradlaned-b restart:gradlaned-b"
CI_FAULTS+=" replace:server@gradlane restart:aggregator@gradlane link:2@gradlane"
FAULTS=${GRADLANE_FAULTS:-$CI_FAULTS}
echo "=== faults during training (tests/faults/run-faults.sh, SEED=$FAULTS_SEED): $FAULTS"
# One seed, fixed, so a CI run injects each fault at the same point as the last: a failure is
# the code's, reproducible with the same command (printed with the table).
faults_ok=0
bash "$ROOT/tests/faults/run-faults.sh" "$BUILD" SEED="$FAULTS_SEED" FAULTS="$FAULTS" OUT="$REPORTS/faults" 2>&1 \
  | tee "$REPORTS/faults.log" || faults_ok=1
python3 - "$REPORTS/faults/table.json" > "$REPORTS/faults.summary" <<'PY' || faults_ok=1
import json, sys
try:
    with open(sys.argv[1]) as f:
        table = json.load(f)
except (OSError, ValueError) as e:  # the list died before its table: one failure
    print(f"faults: 0 passed, 1 failed ({e})")
    sys.exit(1)
print(f"faults: {table['survived']} passed, {table['failed']} failed")
sys.exit(1 if table['failed'] or table['survived'] == 0 else 0)
PY

echo "=== sanitizers: the unit and softroce suites under ASan+UBSan, the sidecar's rings/futexes/client/daemon under TSan"
san_ok=0
GRADLANE_BUILD_DIR=$BUILD bash "$ROOT/ci/sanitizers.sh" ci 2>&1 | tee "$REPORTS/sanitizers.log" || san_ok=1
grep -E '^(asan-unit|asan-softroce|tsan-sidecar): [0-9]+ passed, [0-9]+ failed$' "$REPORTS/sanitizers.log" > "$REPORTS/sanitizers.summary" || true
if [[ $(wc -l < "$REPORTS/sanitizers.summary") -ne 3 ]]; then  # one died before its summary
  echo "sanitizers: 0 passed, 1 failed (see $REPORTS/sanitizers.log)" >> "$REPORTS/sanitizers.summary"
  san_ok=1
fi

install_ok=0
bash "$ROOT/ci/check-install.sh" "$BUILD" > "$REPORTS/install.summary" || install_ok=1
layers_ok=0
python3 "$ROOT/ci/check-layers.py" "$ROOT" > "$REPORTS/layers.summary" || layers_ok=1
format_ok=0
bash "$ROOT/ci/check-format.sh" "$ROOT" > "$REPORTS/format.summary" || format_ok=1
# The scripts' own tests (tests/scripts): the result checkers the experiments and the fault list rely
# on, each check shown to fail; the layer check; the timeline.
scripts_ok=0
python3 - "$ROOT/tests/scripts" "$REPORTS/scripts.log" > "$REPORTS/scripts.summary" <<'PY' || scripts_ok=1
import sys, unittest
suite = unittest.defaultTestLoader.discover(sys.argv[1], pattern="*_test.py")
with open(sys.argv[2], "w") as log:
    result = unittest.TextTestRunner(stream=log, verbosity=2).run(suite)
failed = len(result.failures) + len(result.errors)
print(f"scripts: {result.testsRun - failed} passed, {failed} failed")
sys.exit(1 if failed or result.testsRun == 0 else 0)
PY

unit_ok=0; softroce_ok=0
# shellcheck disable=SC2046
python3 "$ROOT/ci/gtest_summary.py" unit $(names "${unit_bins[@]}") -- "$REPORTS/unit" > "$REPORTS/unit.summary" || unit_ok=1
# shellcheck disable=SC2046
python3 "$ROOT/ci/gtest_summary.py" softroce $(names "${softroce_bins[@]}") -- "$REPORTS/softroce" > "$REPORTS/softroce.summary" || softroce_ok=1
summaries=("$REPORTS/faults.summary" "$REPORTS/fuzz.summary" "$REPORTS/sanitizers.summary" "$REPORTS/layers.summary"
  "$REPORTS/format.summary" "$REPORTS/scripts.summary" "$REPORTS/install.summary" "$REPORTS/unit.summary"
  "$REPORTS/softroce.summary")
cat "${summaries[@]}"
# Last, so a log cut to its head and tail still says which suite failed, where to look, and
# which fuzz input failed (a random find on this machine, which no log outside it keeps).
if failed=$(grep -h -E '^[a-z-]+: [0-9]+ passed, [0-9]+ failed$' "${summaries[@]}" | grep -v ' 0 failed$'); then
  grep -E '^fuzz [a-z_]+(: .*FAILED| input: )' "$REPORTS/fuzz.log" | cut -c1-6000 || true
  echo "FAILED suites (logs in $REPORTS): $(echo "$failed" | paste -sd ';' | sed 's/;/; /g')"
fi
exit $(( faults_ok | fuzz_ok | san_ok | layers_ok | format_ok | scripts_ok | install_ok | unit_ok | softroce_ok ))
