# Sourced by the experiment scripts: raw_runs_dir ROOT RESULTS prints where a study's raw runs go —
# out/<RESULTS' path under perf/results>/runs (ignored by git), or RESULTS/runs when RESULTS lies
# outside perf/results. RESULTS itself gets the summary only.
raw_runs_dir() {
  local rel
  rel=$(realpath -m --relative-to="$1/perf/results" "$2")
  case $rel in ..|../*) echo "$2/runs" ;; *) echo "$1/out/$rel/runs" ;; esac
}
