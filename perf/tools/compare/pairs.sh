#!/usr/bin/env bash
# The inner half of perf/compare-perftest: runs perftest and gradlane's tools pair by pair on
# one device, alternating which goes first so slow drift (a warming host, a busy neighbour)
# hits both alike, and keeps every client's raw output for the report. Runs wherever an RDMA
# device exists: inside the Soft-RoCE VM (ci/softroce.sh) or directly on a cluster node, where
# the client reaches the server over the NIC's loopback.
#
#   pairs.sh --tools DIR --out DIR [--device D] [--gid X] [--addr A] [--reps N] [--tests "..."]
#            [--bw-sizes "..."] [--lat-sizes "..."] [--candidate DIR]
#
# --candidate DIR adds a third contestant, the same tools built against another gradlane
# (e.g. a branch with a fix): it runs in the same alternation and shows up as its own column.
#
# Writes OUT/<test>-<bytes>-<impl>-<rep>.txt (client output), .srv (server output) and one
# line per run to OUT/runs.tsv: test bytes impl rep attempts rc wall_us iterations.
set -uo pipefail

TOOLS='' CANDIDATE='' OUT='' DEVICE=${GRADLANE_DEVICE:-} GID=${GRADLANE_GID_INDEX:-} ADDR=${GRADLANE_ADDR:-}
REPS=3
TESTS="write_bw read_bw write_lat read_lat"
BW_SIZES="4096 8192 16384 32768 65536 131072 262144 524288 1048576 2097152 4194304 8388608"
LAT_SIZES="8 16 32 64 128 256 512 1024 2048 4096 8192 16384 32768 65536"
while (($#)); do
  case $1 in
    --tools) TOOLS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --candidate) CANDIDATE=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --gid) GID=$2; shift 2 ;;
    --addr) ADDR=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    --bw-sizes) BW_SIZES=$2; shift 2 ;;
    --lat-sizes) LAT_SIZES=$2; shift 2 ;;
    *) echo "pairs.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $TOOLS && -n $OUT && -n $DEVICE && -n $GID && -n $ADDR ]] || {
  echo "pairs.sh: --tools, --out, --device, --gid and --addr are required" >&2
  exit 2
}
mkdir -p "$OUT"
RUNS=$OUT/runs.tsv
# The clocksource decides what a clock read costs (HPET: a trapped MMIO read of ~1.35 µs in
# the VM; TSC: ~0.1 µs), which the library's data path does per post: keep it with the data.
clocksource() {
  local f=/sys/devices/system/clocksource/clocksource0/current_clocksource
  REPLY=unknown
  [[ -r $f ]] && read -r REPLY <"$f"
}
clocksource; echo "start $REPLY" >"$OUT/clocksource"
[[ -e $RUNS ]] || printf 'test\tbytes\timpl\trep\tattempts\trc\twall_us\titerations\n' >"$RUNS"
PORT=20000

now_us() { REPLY=${EPOCHREALTIME//[!0-9]/}; }

# perftest's client fails at once when its server is not listening yet, so wait for the TCP
# LISTEN entry. Reads /proc with builtins only: a fork costs ~40 ms under TCG.
wait_listening() {
  local hex i line
  printf -v hex ':%04X ' "$1"
  for ((i = 0; i < 200; i++)); do
    for f in /proc/net/tcp /proc/net/tcp6; do
      [[ -r $f ]] || continue
      while read -r line; do
        [[ $line == *"$hex"* && $line == *" 0A "* ]] && return 0
      done <"$f"
    done
    sleep 0.05
  done
  return 1
}

# Bandwidth is taken in MB/sec (perftest's default unit), not --report_gbits: both print two
# decimals, and 0.31 Gb/s would leave the ratio only ±2 % resolution.
# Iterations per size: enough bytes for a stable average, few enough to keep the whole
# comparison within minutes on a TCG-emulated rxe (~30 MB/s).
bw_iters() { local n=$((33554432 / $1)); ((n > 5000)) && n=5000; ((n < 5)) && n=5; REPLY=$n; }
lat_iters() { local n=$((4194304 / $1)); ((n > 1000)) && n=1000; ((n < 200)) && n=200; REPLY=$n; }

# What perftest chose for inline data and CQ moderation at this size, read from its header,
# so gradlane's tools run with the same (like for like; their header prints it too).
declare -A PERFTEST_INLINE=() PERFTEST_CQMOD=()
learn_perftest_settings() {  # key file
  local key=$1 file=$2 line
  while IFS= read -r line; do
    [[ $line =~ Max\ inline\ data\ :\ ([0-9]+) ]] && PERFTEST_INLINE[$key]=${BASH_REMATCH[1]}
    [[ $line =~ CQ\ Moderation\ +:\ ([0-9]+) ]] && PERFTEST_CQMOD[$key]=${BASH_REMATCH[1]}
  done <"$file"
}

has_result_row() {  # the data row under perftest's/gradlane's result title
  local line seen=''
  while IFS= read -r line; do
    [[ $line == " #bytes"* ]] && { seen=1; continue; }
    [[ -n $seen && $line =~ ^\ [0-9]+\ +[0-9]+\ +[0-9.]+ ]] && return 0
  done <"$1"
  return 1
}

run_one() {  # test bytes impl rep iterations
  local test=$1 bytes=$2 impl=$3 rep=$4 iters=$5 attempt rc wall t0 t1 server_pid
  local base=$OUT/$test-$bytes-$impl-$rep
  local -a args common
  if [[ $impl == perftest ]]; then
    # -F: do not abort on CPU-frequency warnings (the VM has no cpufreq).
    common=(-d "$DEVICE" -x "$GID" -s "$bytes" -n "$iters" -F)
  else
    common=(-d "$DEVICE" -x "$GID" -s "$bytes" -n "$iters" --timeout 60)
    [[ $test == write_* && -n ${PERFTEST_INLINE[$test-$bytes]:-} ]] && common+=(-I "${PERFTEST_INLINE[$test-$bytes]}")
    [[ $test == *_bw && -n ${PERFTEST_CQMOD[$test-$bytes]:-} ]] && common+=(-Q "${PERFTEST_CQMOD[$test-$bytes]}")
  fi
  local exe
  case $impl in
    perftest) exe=ib_$test ;;
    gradlane) exe=$TOOLS/gradlane_$test ;;
    candidate) exe=$CANDIDATE/gradlane_$test ;;
  esac
  # perftest's report sometimes fails under TCG ("r^2 < 0.9 ... Can't produce a report"):
  # retry it (and us, for symmetry) up to three times, on a fresh port each time.
  for attempt in 1 2 3; do
    PORT=$((PORT + 1))
    args=("${common[@]}" -p "$PORT")
    timeout -k 5 120 "$exe" "${args[@]}" >"$base.srv" 2>&1 &
    server_pid=$!
    [[ $impl == perftest ]] && { wait_listening "$PORT" || echo "pairs.sh: $exe server did not listen on $PORT" >&2; }
    now_us; t0=$REPLY
    timeout -k 5 120 "$exe" "${args[@]}" "$ADDR" >"$base.txt" 2>&1
    rc=$?
    now_us; t1=$REPLY
    wait "$server_pid" 2>/dev/null
    wall=$((t1 - t0))
    ((rc == 0)) && has_result_row "$base.txt" && break
    echo "pairs.sh: $impl $test $bytes B rep $rep attempt $attempt failed (rc $rc): $(tail -n 1 "$base.txt")" >&2
    ((rc == 0)) && rc=1
  done
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$test" "$bytes" "$impl" "$rep" "$attempt" "$rc" "$wall" "$iters" >>"$RUNS"
  [[ $impl == perftest && $rc == 0 ]] && learn_perftest_settings "$test-$bytes" "$base.txt"
  return 0
}

for test in $TESTS; do
  if [[ $test == *_bw ]]; then sizes=$BW_SIZES; else sizes=$LAT_SIZES; fi
  for bytes in $sizes; do
    if [[ $test == *_bw ]]; then bw_iters "$bytes"; else lat_iters "$bytes"; fi
    iters=$REPLY
    for ((rep = 1; rep <= REPS; rep++)); do
      # ABBA: who goes first flips every repetition. perftest goes first in the first one so
      # its inline/CQ settings at this size are known before gradlane's tool runs.
      if ((rep % 2 == 1)); then order="perftest gradlane"; else order="gradlane perftest"; fi
      if [[ -n $CANDIDATE ]]; then
        if ((rep % 2 == 1)); then order="perftest gradlane candidate"; else order="candidate gradlane perftest"; fi
      fi
      for impl in $order; do run_one "$test" "$bytes" "$impl" "$rep" "$iters"; done
    done
    echo "pairs.sh: $test $bytes B done" >&2
  done
done
clocksource; echo "end $REPLY" >>"$OUT/clocksource"
