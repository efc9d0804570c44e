# Sourced by the example scripts: gives the run's processes a job key as a cluster's would have
# one, in a file only its owner reads (GRADLANE_JOB_KEY_FILE, mode 0600) — gradlane's programs
# refuse to run without a key. A key the caller set is kept.
# Usage: . examples/job-key.sh DIR   (DIR: where the key file goes)
if [ -z "${GRADLANE_JOB_KEY_FILE:-}${GRADLANE_JOB_KEY:-}" ]; then
  GRADLANE_JOB_KEY_FILE=$1/job.key
  (umask 077 && head -c 24 /dev/urandom | base64 > "$GRADLANE_JOB_KEY_FILE")
  export GRADLANE_JOB_KEY_FILE
fi
