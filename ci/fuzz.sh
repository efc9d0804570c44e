#!/usr/bin/env bash
# Bounded fuzzing of the decoders a hostile peer or application feeds (tests/fuzz), with
# libFuzzer from Debian's clang. Configures its own build dir with Clang and GRADLANE_FUZZ=ON,
# builds only the fuzz targets, runs each on a temporary copy of its checked-in corpus
# (tests/fuzz/corpus/<target>, left as it is) for SECONDS_PER_TARGET, and prints one line per
# target with the executions run, then the summary:
#   fuzz: N passed, M failed
# A target fails on a crash, a sanitizer report, a violated invariant (the targets abort), a
# hang, or if it executed nothing. Exits non-zero if any target failed or the build did. The
# inputs that failed and each target's log are kept in <build>/fuzz-artifacts.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: ci/fuzz.sh [SECONDS_PER_TARGET]

Fuzzes each target for SECONDS_PER_TARGET (default 15: 75 s for the five) after building
them in $GRADLANE_FUZZ_BUILD_DIR (default build-fuzz). JOBS sets the build's parallelism.
EOF
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${GRADLANE_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
JOBS=${JOBS:-$(nproc)}
case ${1:-} in
  -h | --help) usage; exit 0 ;;
esac
PER_TARGET=${1:-15}
[[ $PER_TARGET =~ ^[1-9][0-9]*$ ]] || { usage >&2; exit 2; }
((${#} <= 1)) || { usage >&2; exit 2; }

# The names of tests/fuzz/CMakeLists.txt's GRADLANE_FUZZERS: gradlane_fuzz_<name>, corpus/<name>.
TARGETS=(entry_check peer_messages wire ps peer_policy)

start=$SECONDS
mkdir -p "$BUILD"
# Debug for assert()s, -O1 for speed (libFuzzer's usual); only what configure needs for the
# library's own dependencies, none of the daemon's, tests' or tools'.
if ! CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
       -DGRADLANE_FUZZ=ON -DGRADLANE_WERROR=ON -DGRADLANE_BUILD_DAEMON=OFF -DGRADLANE_BUILD_EXAMPLES=OFF -DGRADLANE_BUILD_TRAINER=OFF \
       -DGRADLANE_BUILD_TESTS=OFF -DGRADLANE_BUILD_PERF=OFF >"$BUILD/configure.log" 2>&1 ||
   ! cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]/#/gradlane_fuzz_}"; then
  [[ -f $BUILD/configure.log ]] && tail -20 "$BUILD/configure.log"
  echo "fuzz: the fuzz build failed (clang and libclang-rt-14-dev come from ci/install-deps.sh)"
  echo "fuzz: 0 passed, ${#TARGETS[@]} failed"
  exit 1
fi
built=$((SECONDS - start))

ARTIFACTS=$BUILD/fuzz-artifacts
rm -rf "$ARTIFACTS"
mkdir -p "$ARTIFACTS"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0
for name in "${TARGETS[@]}"; do
  cp -r "$ROOT/tests/fuzz/corpus/$name" "$WORK/$name"  # libFuzzer adds what it finds to its corpus
  log=$ARTIFACTS/$name.log
  rc=0
  # -timeout: one input running 10 s is a hang, and a failure. Sanitizer reports abort (the
  # build has no recovery), which libFuzzer turns into a crash with the input saved.
  UBSAN_OPTIONS=print_stacktrace=1 "$BUILD/tests/fuzz/gradlane_fuzz_$name" "$WORK/$name" \
    -max_total_time="$PER_TARGET" -print_final_stats=1 -timeout=10 -artifact_prefix="$ARTIFACTS/$name-" \
    >"$log" 2>&1 || rc=$?
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # Belt and braces: a report that somehow did not end the run still fails the target.
  reports=$(grep -cE '^==[0-9]+==ERROR|runtime error:|fuzz invariant violated|^ERROR: libFuzzer' "$log" || true)
  if ((rc == 0 && reports == 0)) && [[ ${executions:-0} -gt 0 ]]; then
    passed=$((passed + 1))
    verdict=ok
  else
    failed=$((failed + 1))
    first=$(grep -m1 -E '^==[0-9]+==ERROR|runtime error:|fuzz invariant violated|^ERROR: libFuzzer|^SUMMARY:' "$log" || true)
    verdict="FAILED (exit $rc; ${first:-no report}; log $log)"
    echo "---- $name: last lines of its log"
    tail -40 "$log"
  fi
  printf 'fuzz %s: %s executions in %s s, %s\n' "$name" "${executions:-?}" "$PER_TARGET" "$verdict"
  # The input itself, in a line CI's summary repeats: a failure found on a CI machine by a random
  # seed reproduces anywhere from its log alone.
  for input in "$ARTIFACTS/$name"-{crash,leak,timeout,oom}-*; do
    if [[ -e $input ]]; then
      printf 'fuzz %s input: %s (rerun: base64 -d > in; %s in)\n' "$name" "$(base64 -w0 "$input")" \
        "$BUILD/tests/fuzz/gradlane_fuzz_$name"
    fi
  done
done
echo "fuzz: built in $built s, fuzzed in $((SECONDS - start - built)) s"
echo "fuzz: $passed passed, $failed failed"
((failed == 0))
