#!/usr/bin/env bash
# The suites under sanitizers, each in its own build directory next to the
# normal one, each ending with a summary line like the other suites':
#   asan-unit: N passed, M failed       every unit test, ASan + UBSan (GRADLANE_SANITIZE)
#   asan-softroce: N passed, M failed   the softroce suite over rxe, ASan + UBSan, in the VM
#   tsan-sidecar: N passed, M failed    the shared-memory rings, futexes, client and daemon
#                                       (gradlane_sidecar_tests: the daemon runs on a thread of
#                                       the test process, so ThreadSanitizer sees both sides)
# Usage: ci/sanitizers.sh [all|asan|asan-unit|tsan|ci] (all). ci = all three, what ci/test.sh
# runs, but for the end-to-end training runs in the softroce suite (gradlane_train_softroce_tests:
# ~4 of its ~9 min under ASan, over code the parameter-server and sidecar softroce tests cover);
# the perf tools' smoke tests are in neither: sanitized builds skip perf/. Builds in $GRADLANE_BUILD_DIR-asan / -tsan
# (default build-asan, build-tsan). Exit status non-zero if any suite failed or did not run.
# Any sanitizer report fails the test that triggered it: UBSan does not recover, ASan aborts,
# TSan exits non-zero (halt_on_error) — a report never passes as a green test.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHICH=${1:-all}
case $WHICH in
  all) ASAN=1 ASAN_SOFTROCE=1 TSAN=1 ;;
  asan) ASAN=1 ASAN_SOFTROCE=1 TSAN='' ;;
  asan-unit) ASAN=1 ASAN_SOFTROCE='' TSAN='' ;;
  tsan) ASAN='' ASAN_SOFTROCE='' TSAN=1 ;;
  ci) ASAN=1 ASAN_SOFTROCE=1 TSAN=1 SKIP_SOFTROCE=gradlane_train_softroce_tests ;;
  *) echo "sanitizers.sh: all, asan, asan-unit, tsan or ci, not '$WHICH'" >&2; exit 2 ;;
esac
BASE=${GRADLANE_BUILD_DIR:-$ROOT/build}
JOBS=${JOBS:-$(nproc)}
rc=0
summaries=()

configure_and_build() {  # DIR OPTION TARGET...
  local dir=$1 option=$2
  shift 2
  mkdir -p "$dir"
  # -O1 -g1: what the sanitizers' own docs suggest, at half the compile time of -O2 -g; line
  # tables are enough for a report's stack.
  cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
        -DGRADLANE_WERROR=ON "-D$option=ON" -DGRADLANE_BUILD_PERF=OFF > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; return 1; }
  cmake --build "$dir" -j"$JOBS" ${1:+--target "$@"}
}

if [[ -n $ASAN ]]; then
  dir=$BASE-asan reports=$BASE-asan/test-reports
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  configure_and_build "$dir" GRADLANE_SANITIZE
  rm -rf "$reports"; mkdir -p "$reports/unit" "$reports/softroce"
  mapfile -t unit < <(find "$dir/tests" -type f -perm -u+x -name 'gradlane_*_tests' ! -name '*softroce_tests' | sort)
  mapfile -t softroce < <(find "$dir/tests" -type f -perm -u+x -name '*softroce_tests' ! -name "${SKIP_SOFTROCE:-none}" | sort)
  for bin in "${unit[@]}"; do
    echo "=== asan: $(basename "$bin")"
    "$bin" --gtest_output="json:$reports/unit/$(basename "$bin").json" || true
  done
  if [[ -n $ASAN_SOFTROCE ]]; then
    # Sanitized processes need more memory than the VM's default 2 GiB when a test runs several.
    SOFTROCE_MEM=${SOFTROCE_MEM:-4096} SOFTROCE_OUT="$reports/softroce" \
      bash "$ROOT/ci/softroce.sh" --hosts 3 -- sh "$ROOT/ci/softroce-suite.sh" "${softroce[@]}" || true
  fi
  names() { for b in "$@"; do basename "$b"; done; }
  # shellcheck disable=SC2046
  summaries+=("$(python3 "$ROOT/ci/gtest_summary.py" asan-unit $(names "${unit[@]}") -- "$reports/unit")") || rc=1
  if [[ -n $ASAN_SOFTROCE ]]; then
    # shellcheck disable=SC2046
    summaries+=("$(python3 "$ROOT/ci/gtest_summary.py" asan-softroce $(names "${softroce[@]}") -- "$reports/softroce")") || rc=1
  fi
fi

if [[ -n $TSAN ]]; then
  dir=$BASE-tsan reports=$BASE-tsan/test-reports
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
  configure_and_build "$dir" GRADLANE_SANITIZE_THREAD gradlane_sidecar_tests
  rm -rf "$reports"; mkdir -p "$reports"
  echo "=== tsan: gradlane_sidecar_tests"
  "$dir/tests/sidecar/gradlane_sidecar_tests" --gtest_output="json:$reports/gradlane_sidecar_tests.json" || true
  summaries+=("$(python3 "$ROOT/ci/gtest_summary.py" tsan-sidecar gradlane_sidecar_tests -- "$reports")") || rc=1
fi

printf '%s\n' "${summaries[@]}"
exit $rc
