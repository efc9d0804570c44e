# Sourced by the scripts that start gradlane programs on emulated hosts: make_job_key DIR gives
# the run's processes a job key as a cluster's would have one, in a file only its owner reads
# (GRADLANE_JOB_KEY_FILE, mode 0600, in DIR) — gradlane's programs refuse to run without a key.
# A key the caller set is kept.
make_job_key() {
  if [ -z "${GRADLANE_JOB_KEY_FILE:-}${GRADLANE_JOB_KEY:-}" ]; then
    GRADLANE_JOB_KEY_FILE=$1/job.key
    (umask 077 && head -c 24 /dev/urandom | base64 > "$GRADLANE_JOB_KEY_FILE")
    export GRADLANE_JOB_KEY_FILE
  fi
}
