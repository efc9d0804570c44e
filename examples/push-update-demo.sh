#!/bin/sh
# Runs the README example inside a Soft-RoCE environment: a server and a worker process on
# $GRADLANE_DEVICE (set by ci/softroce.sh). Usage: examples/push-update-demo.sh BUILD_DIR
set -eu
bin="$1/examples/push_update"
. "$(dirname "$0")/../ci/softroce/job-key.sh"; make_job_key "${GRADLANE_OUT_DIR:-/tmp}"
"$bin" "$GRADLANE_DEVICE" &
server=$!
"$bin" "$GRADLANE_DEVICE" "$GRADLANE_ADDR"
wait "$server"
