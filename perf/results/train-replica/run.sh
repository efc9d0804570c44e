#!/usr/bin/env bash
# The replica on/off comparison of docs/results.md (straggler case): the three variants interleaved per seed.
# Each variant's table goes to perf/results/train-replica/<variant>/results.md, its raw runs to
# out/train-replica/<variant>/runs/ (ignored by git: examples/train-experiment.sh's RUNS default).
set -u
cd "$(dirname "$0")/../../.."
for seed in 1 2 3; do
  bash examples/train-experiment.sh SEEDS=$seed STRAGGLERS=1 MODES="gradlane fifo" REPLICA=0 RESULTS=perf/results/train-replica/off
  bash examples/train-experiment.sh SEEDS=$seed STRAGGLERS=1 MODES="gradlane fifo" REPLICA=1 RESULTS=perf/results/train-replica/mirror
  bash examples/train-experiment.sh SEEDS=$seed STRAGGLERS=1 MODES="gradlane fifo" REPLICA=1 REPLICA_READS=1 RESULTS=perf/results/train-replica/reads
done
echo ALLDONE
