#!/bin/sh
# Runs inside the Soft-RoCE environment (ci/softroce.sh): every softroce test binary, one
# after the other, each leaving a GoogleTest JSON report in $GRADLANE_OUT_DIR.
# Usage: ci/softroce-suite.sh [--filter GTEST_FILTER] BINARY...
status=0
filter=
if [ "${1:-}" = "--filter" ]; then
  filter=$2
  shift 2
fi
for bin in "$@"; do
  name=$(basename "$bin")
  echo "=== $name"
  if [ -n "$filter" ]; then
    "$bin" --gtest_filter="$filter" --gtest_output="json:$GRADLANE_OUT_DIR/$name.json" || status=1
  else
    "$bin" --gtest_output="json:$GRADLANE_OUT_DIR/$name.json" || status=1
  fi
done
exit $status
