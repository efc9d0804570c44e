#!/bin/bash
# shellcheck source-path=SCRIPTDIR
# Runs inside the Soft-RoCE VM, as root, chrooted into the host's root (see init.sh):
# sets up the rxe topology, then runs the caller's CMD in the caller's directory with the
# caller's environment. Talks to the host over three virtio serial ports, which need no
# tty settings and keep CMD's output apart from the kernel console:
#   port 1: CMD's stdout    port 2: CMD's stderr
#   port 3: status lines for ci/softroce.sh ("up DESCRIPTION", "fail WHY", "rc CODE CENTISECONDS")
# job.env (written by the host) defines SR_CMD SR_CWD SR_ENV SR_HOSTS SR_SHAPES SR_OUT
# SR_TCP_OVER_LINKS.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

here=/run/softroce
# shellcheck source=/dev/null
source "$here/job.env"
# shellcheck source=net.sh
source "$here/net.sh"

# REPLY = the device of virtio port NR. Port numbers are fixed on the qemu command line
# (nr=1..3); the N of vportNpM is the virtio device index, which depends on device order.
find_port() {
  local nr=$1 attempt dev
  for ((attempt = 0; attempt < 50; attempt++)); do
    for dev in /dev/vport*p"$nr"; do
      [[ -c $dev ]] || continue
      REPLY=$dev
      return 0
    done
    sleep 0.1
  done
  echo "softroce-guest: no virtio port $nr" >&2
  exit 1
}
find_port 1; exec 7>"$REPLY"
find_port 2; exec 8>"$REPLY"
find_port 3; exec 9>"$REPLY"

status() { printf '%s\n' "$*" >&9; }
fail() {
  echo "softroce-guest: $*" >&2
  status "fail $*"
  exit 1
}
# Guest uptime in centiseconds (/proc/uptime has two decimals), without a fork.
uptime_cs() {
  local up _
  read -r up _ </proc/uptime
  REPLY=$((10#${up/./}))
}

[[ -e /dev/infiniband/rdma_cm ]] || fail "no /dev/infiniband/rdma_cm: rdma_ucm not loaded (console log has the insmod errors)"
if ((SR_HOSTS > 1)); then
  softroce_net_up_hosts "$SR_HOSTS" || fail "multi-host setup failed"
  softroce_net_shape "${SR_SHAPES[@]}" || fail "tc shaping failed"
  ((SR_TCP_OVER_LINKS == 0)) || softroce_net_tcp_over_links "$SR_HOSTS" || fail "routing TCP over the links failed"
else
  softroce_net_up_single || fail "rxe setup failed"
fi

# Registering gradient buffers pins them; the default 8 MiB memlock limit is far too small.
ulimit -l unlimited
cd "$SR_CWD" || fail "cannot cd to $SR_CWD (is it visible from the host's / ?)"
for kv in "${SR_ENV[@]}"; do export "${kv?}"; done
export GRADLANE_DEVICE=$SOFTROCE_DEVICE GRADLANE_ADDR=$SOFTROCE_ADDR \
  GRADLANE_GID_INDEX=$SOFTROCE_GID_INDEX GRADLANE_HOSTS=$SOFTROCE_HOSTS \
  GRADLANE_OUT_DIR=$SR_OUT GRADLANE_SOFTROCE=vm

read -r root_kind <"$here/root_kind"
[[ $root_kind == overlay ]] || SOFTROCE_DESCRIPTION+=", read-only root"
uptime_cs
start=$REPLY
echo "softroce-guest: $SOFTROCE_DESCRIPTION; running ${SR_CMD[*]}"
status "up $SOFTROCE_DESCRIPTION"
"${SR_CMD[@]}" </dev/null >&7 2>&8 7>&- 8>&- 9>&-
rc=$?
uptime_cs
echo "softroce-guest: CMD exited $rc"
status "rc $rc $((REPLY - start))"
exec 7>&- 8>&- 9>&-
exit 0
