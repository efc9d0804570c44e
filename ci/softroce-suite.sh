#!/bin/sh
# Runs inside the Soft-RoCE environment (ci/softroce.sh): every softroce test binary, one
# after the other, each leaving a GoogleTest JSON report in $GRADLANE_OUT_DIR.
# Usage: ci/softroce-suite.sh BINARY...
status=0
for bin in "$@"; do
  name=$(basename "$bin")
  echo "=== $name"
  "$bin" --gtest_output="json:$GRADLANE_OUT_DIR/$name.json" || status=1
done
exit $status
