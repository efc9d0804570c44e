#!/bin/sh
# One fault, injected into a running training job (trainer/train-job.sh FAULT=...), then a
# watchdog: every role must end within HANG_S of the fault, else it is recorded as hung and
# killed, so the run always ends. Runs inside the Soft-RoCE harness, next to the roles.
#   sh tests/faults/inject-fault.sh OUT_DIR KIND:TARGET:AT
# KIND:TARGET   kill:ROLE     SIGKILL the role (server, replica, workerI, aggregator)
#               stop:ROLE     SIGSTOP it for STOP_S seconds (6: longer than the 3 s hole
#                             timeout and the ~2 s silent-peer timeout), then SIGCONT
#               restart:ROLE  SIGKILL it, then RESTART_S (1) s later start it again with its
#                             command (ROLE.cmd); a worker from the step after its last
#                             acknowledged push (its pushes.csv, moved to
#                             killed-ROLE.pushes.csv): it must rejoin the running job; an
#                             aggregator with --rejoin: its workers must come back to it
#               replace:server  SIGKILL the server; once the replica is promoted, start a new
#                             replica on the server's host that joins it (gradlane_train
#                             replica --join, files replica2.*): it must follow it bitwise
#               link:HOST     host HOST cut off for LINK_S s (4): its bridge port hHOST-p disabled
#                             (every frame to and from it dropped at the switch), then forwarding
#               netem:HOST    NETEM (loss 10% delay 20ms) on host HOST's link, both
#                             directions, for NETEM_S s (5)
# AT: vK once the server has applied version K (an event: on a loaded machine a delay lands at
# another point of the job; up to AT_WITHIN_S (120) s, then the fault goes in anyway, and
# fault.json says so), or DELAY_MS after training started (the server's snapshots.bin
# appears: every worker is connected).
# Writes OUT_DIR/fault.json: what was done when (epoch seconds), the model version then, and
# which roles were still running HANG_S after the fault.
set -u
OUT=${1:?usage: inject-fault.sh OUT_DIR KIND:TARGET:DELAY_MS}
FAULT=${2:?usage: inject-fault.sh OUT_DIR KIND:TARGET:AT}
KIND=${FAULT%%:*}; REST=${FAULT#*:}; TARGET=${REST%%:*}; AT=${REST#*:}
AT_WITHIN_S=${AT_WITHIN_S:-120}
STOP_S=${STOP_S:-6}; RESTART_S=${RESTART_S:-1}; LINK_S=${LINK_S:-4}; NETEM_S=${NETEM_S:-5}; HANG_S=${HANG_S:-120}
NETEM=${NETEM:-loss 10% delay 20ms}
now() { date +%s.%N; }
last_version() { v=$(tail -n 1 "$OUT/$1.versions.csv" 2>/dev/null); echo "${v%%,*}"; }

# Training starts when the server has every worker: it then writes its first snapshot.
i=0
while [ ! -s "$OUT/snapshots.bin" ] && [ $i -lt 6000 ]; do sleep 0.05; i=$((i + 1)); done
started=$(now)
at_version=null delay_ms=null trigger=reached
case $AT in
  v*)
    at_version=${AT#v}
    read -r up _ < /proc/uptime; give_up=$(( ${up%.*} + AT_WITHIN_S ))
    while v=$(last_version server); [ "${v:-0}" -lt "$at_version" ]; do
      read -r up _ < /proc/uptime
      if [ "${up%.*}" -ge "$give_up" ]; then trigger=timeout; break; fi
      sleep 0.02
    done ;;
  *) delay_ms=$AT; sleep "$((AT / 1000)).$(printf %03d $((AT % 1000)))" ;;
esac

alive() { [ -f "$OUT/$1.pid" ] && [ ! -f "$OUT/$1.exit" ]; }
# start_role NAME CMD_FILE EXTRA...: the command in CMD_FILE (an argument a line) and EXTRA, in
# the background as role NAME (NAME.pid, NAME.log, NAME.exit), as train-job.sh's role() runs one.
start_role() {
  name=$1 cmd=$2; shift 2
  (
    IFS='
'
    set -- $(cat "$cmd") "$@"
    unset IFS
    sh -c 'echo $$ > "$0"; exec "$@"' "$OUT/$name.pid" "$@" > "$OUT/$name.log" 2>&1
    rc=$?; echo "$rc $(date +%s.%N)" > "$OUT/$name.exit"
  ) &
}
target_alive=1 ended=""
# The fault's time twice: epoch seconds (the roles' .exit times) and seconds since boot
# (/proc/uptime, read without a fork: the clock of the replica's promoted_at_ns).
mark() { injected=$(now); read -r uptime _ < /proc/uptime; }
case $KIND in
  kill|stop)
    alive "$TARGET" || target_alive=0
    pid=$(cat "$OUT/$TARGET.pid" 2>/dev/null || echo 0)
    mark
    if [ "$KIND" = kill ]; then kill -KILL "$pid"
    else kill -STOP "$pid"; sleep "$STOP_S"; kill -CONT "$pid"; ended=$(now); fi ;;
  restart)
    alive "$TARGET" || target_alive=0
    pid=$(cat "$OUT/$TARGET.pid" 2>/dev/null || echo 0)
    mark
    kill -KILL "$pid"
    sleep "$RESTART_S"
    i=0; while [ ! -f "$OUT/$TARGET.exit" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
    mv "$OUT/$TARGET.exit" "$OUT/killed-$TARGET.exit"
    mv "$OUT/$TARGET.log" "$OUT/killed-$TARGET.log"
    resume=""
    case $TARGET in
      worker*)
        mv "$OUT/$TARGET.pushes.csv" "$OUT/killed-$TARGET.pushes.csv"
        [ -f "$OUT/$TARGET.members.csv" ] && mv "$OUT/$TARGET.members.csv" "$OUT/killed-$TARGET.members.csv"
        last=$(tail -n 1 "$OUT/killed-$TARGET.pushes.csv"); last=${last%%,*}
        case $last in ''|*[!0-9]*) first=0 ;; *) first=$((last + 1)) ;; esac
        resume="--first-step $first"
        echo "restarting $TARGET from step $first" ;;
      aggregator)
        # Its first life's forward log stays (the second starts its own); the workers that lost
        # it come back when the server tells them where it listens.
        for f in members.csv updates.csv; do [ -f "$OUT/aggregator.$f" ] && mv "$OUT/aggregator.$f" "$OUT/killed-aggregator.$f"; done
        resume="--rejoin"
        echo "restarting aggregator (--rejoin)" ;;
      *) echo "restarting $TARGET" ;;
    esac
    start_role "$TARGET" "$OUT/$TARGET.cmd" $resume
    ended=$(now) ;;
  replace)
    alive server || target_alive=0
    pid=$(cat "$OUT/server.pid" 2>/dev/null || echo 0)
    mark
    kill -KILL "$pid"
    i=0; while ! grep -q "promoted to server" "$OUT/replica.log" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
    # The replica's command, on the server's device and port 7810, joining the promoted replica.
    dev=$(sed -n '/^--device$/{n;p;q}' "$OUT/server.cmd"); at=$(sed -n '/^--replica$/{n;p;q}' "$OUT/server.cmd")
    echo "replacing the replica: $dev joins $at"
    # gradlane mode: the sidecar of the server's host, where a promoted replica2 would attach.
    shm=$(sed -n '/^--sidecar$/{n;p;q}' "$OUT/server.cmd")
    sed -e '/^--port$/{n;s/.*/7810/;}' -e "/^--device\$/{n;s/.*/$dev/;}" -e "/^--sidecar\$/{n;s#.*#$shm#;}" \
      "$OUT/replica.cmd" > "$OUT/replica2.cmd"
    start_role replica2 "$OUT/replica2.cmd" --join "$at" --name replica2
    ended=$(now) ;;
  link)
    mark
    # The switch drops the host's frames; its carrier stays up, as behind a failed switch or a
    # cut further along. Taking the port down instead drops the carrier, and Linux 6.1's rxe
    # then spins in rxe_requester under the next ibv_post_send (a soft lockup that ends the VM).
    bridge link set dev "h$TARGET-p" state 0; sleep "$LINK_S"; bridge link set dev "h$TARGET-p" state 3
    ended=$(now) ;;
  netem)
    mark
    # h<I>-p sends what host I receives, h<I> what it sends.
    tc qdisc replace dev "h$TARGET-p" root netem $NETEM; tc qdisc replace dev "h$TARGET" root netem $NETEM
    sleep "$NETEM_S"
    tc qdisc del dev "h$TARGET-p" root; tc qdisc del dev "h$TARGET" root; ended=$(now) ;;
  *) echo "inject-fault.sh: unknown fault kind '$KIND'" >&2; mark; target_alive=0 ;;
esac
# The server's last version when the fault hit (for kill:server, the version it died at).
version=$(last_version server); [ -n "$version" ] || version=0
echo "injected $FAULT at $injected (training started $started, server version $version)"

# The watchdog: nothing may outlive the fault by HANG_S (by the clock: a loaded emulator makes
# every fork slow, so counting sleeps would not bound it).
read -r up _ < /proc/uptime
deadline=$(( ${up%.*} + HANG_S ))
while :; do
  running=""
  for f in "$OUT"/*.pid; do n=${f##*/}; n=${n%.pid}; alive "$n" && running="$running $n"; done
  [ -z "$running" ] && break
  read -r up _ < /proc/uptime
  [ "${up%.*}" -ge "$deadline" ] && break
  sleep 0.25
done
hung=""
for f in "$OUT"/*.pid; do
  n=${f##*/}; n=${n%.pid}
  if alive "$n"; then
    hung="$hung\"$n\","
    p=$(cat "$f")
    echo "hung: $n still running $HANG_S s after the fault: killed (it was in $(cat /proc/$p/wchan 2>/dev/null), syscall $(cut -d' ' -f1 /proc/$p/syscall 2>/dev/null); threads: $(for t in /proc/$p/task/*; do printf '%s ' "$(cat $t/wchan 2>/dev/null)"; done))"
    # Where it hung, when gdb is at hand (not needed for the verdict).
    command -v gdb > /dev/null && timeout -k 5 60 gdb -p "$p" -batch -ex 'thread apply all bt' > "$OUT/$n.hung-stack.txt" 2>&1
    kill -CONT "$(cat "$f")" 2>/dev/null; kill -KILL "$(cat "$f")" 2>/dev/null
  fi
done
printf '{"fault":"%s","kind":"%s","target":"%s","delay_ms":%s,"at_version":%s,"trigger":"%s","started":%s,"injected":%s,"injected_uptime":%s,"ended":%s,"version_at_injection":%s,"target_alive":%s,"hang_s":%s,"hung":[%s]}\n' \
  "$FAULT" "$KIND" "$TARGET" "$delay_ms" "$at_version" "$trigger" "$started" "$injected" "$uptime" "${ended:-null}" "$version" \
  "$([ $target_alive = 1 ] && echo true || echo false)" "$HANG_S" "$(echo "$hung" | sed 's/,$//')" > "$OUT/fault.json"
