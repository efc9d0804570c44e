#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Run a command where a Soft-RoCE (rdma_rxe) device exists: natively when this kernel has
# rdma_rxe, otherwise inside a qemu VM that boots Debian's own kernel. The recipe and the
# pitfalls cited below ("pitfall N") are in shared/softroce-notes.md.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: ci/softroce.sh [--hosts N] [--shape I:RATE[:in|:out]]... [--tcp-over-links] -- CMD [ARGS...]

Runs CMD where a Soft-RoCE device exists and exits with CMD's exit code (125 when the
harness itself failed: VM did not boot, timeout, ...). CMD's stdout and stderr are this
script's stdout and stderr; the harness's own status lines go to stderr, prefixed "softroce:".

Natively if this kernel has rdma_rxe (needs root); otherwise in a qemu VM booting Debian's
kernel, where the host's / is shared read-only under a RAM overlay (CMD may write anywhere,
but only GRADLANE_OUT_DIR reaches the host) and CMD runs in the caller's directory.

Options:
  --hosts N        N emulated hosts (2..8) on a bridge: host i = veth h<i>, 198.18.0.1<i>,
                   device rxe<i>. Default: one host, rxe0 on veth0, 198.18.0.1.
  --shape I:RATE   limit host I's link to RATE (tc tbf rate, e.g. 40mbit) in both
                   directions. Repeatable. Needs --hosts.
  --shape I:RATE:in   only the traffic into host I (a server whose ingress is the
                   bottleneck while its replies and the model's READ responses are not)
  --shape I:RATE:out  only the traffic out of host I (workers whose pushes share a
                   host's egress while the model they pull arrives unshaped)
  --tcp-over-links TCP between two hosts' addresses crosses their links (veth -> bridge ->
                   veth, shaped as they are) instead of the loopback the shared namespace
                   gives it, from a socket bound to host I's address or a process of uid
                   10000 + I (host I's). RDMA crosses the links either way. Needs --hosts.
  -h, --help       this message

CMD's environment (both modes):
  GRADLANE_DEVICE     rxe0 (host 0)
  GRADLANE_ADDR       198.18.0.1, or 198.18.0.10 with --hosts (host 0)
  GRADLANE_GID_INDEX  RoCE v2 GID index of that address on that device (normally 1)
  GRADLANE_HOSTS      "rxe0,198.18.0.10 rxe1,198.18.0.11 ..." (one pair without --hosts)
  GRADLANE_OUT_DIR    writable directory that the host sees (SOFTROCE_OUT)
  GRADLANE_SOFTROCE   vm or native
In the VM, CMD also gets the caller's PATH, HOME, USER, LANG, LC_*, TZ, TERM, CI,
LD_LIBRARY_PATH, *SAN_OPTIONS, RDMAV_*, IBV_*, GRADLANE_*, GTEST_* and SOFTROCE_PASS_ENV's names.

Settings (environment):
  SOFTROCE_MODE=auto|vm|native  where to run (auto)
  SOFTROCE_OUT=DIR              results directory (default: a new mktemp -d, named at
                                the end if CMD left files in it, else removed)
  SOFTROCE_TIMEOUT=SECONDS      bound on the VM's whole life (1500)
  SOFTROCE_CACHE=DIR            kernel cache (${XDG_CACHE_HOME:-$HOME/.cache}/gradlane-softroce)
  SOFTROCE_ACCEL=tcg|kvm        kvm only on runners with real VT-x/AMD-V (tcg)
  SOFTROCE_MEM=MiB, SOFTROCE_SMP=N   VM size (2048, 2)
  SOFTROCE_PASS_ENV="A B"       more variable names to pass into the VM
  SOFTROCE_KERNEL_PACKAGE=NAME  kernel package (default: what linux-image-amd64 depends on)
  SOFTROCE_APPEND="..."         more kernel parameters for the VM
  SOFTROCE_KEEP=1               keep the VM's work directory (console log, initramfs)
EOF
}

ASSETS=$(cd "$(dirname "${BASH_SOURCE[0]}")/softroce" && pwd -P)
readonly ASSETS
readonly EXIT_HARNESS=125

# Modules for the initramfs, by name; dependencies are added from modules.dep. There is no
# modprobe in the VM: whatever would be autoloaded must be listed. "?" = optional.
readonly VM_MODULES=(
  virtio_pci 9pnet_virtio 9p overlay virtio_console # host root, results share, output ports
  crc32_generic '?crc32_pclmul'                     # rxe's crc32 shash (pitfall 2)
  rdma_rxe ib_uverbs rdma_ucm                       # uverbs0 + rdma_cm device nodes
  veth bridge sch_tbf sch_netem sch_htb             # topologies; tc can't autoload qdiscs
  sch_prio sch_drr cls_u32                          # classes by DSCP under a shaped link
)

HOSTS=1
SHAPES=()
TCP_OVER_LINKS=0
OUT_DIR=''
OUT_DIR_MADE=''
CACHE=''
KVER='' KROOT='' KIMAGE=''
BASE_INITRD='' BASE_KEY='' BASE_HOW=''
MODULE_PATHS=()
SR_ENV=()
CMD=()
T_START=0
WORK=''
QEMU_PID=''

log() { printf 'softroce: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit "$EXIT_HARNESS"
}

now_us() { REPLY=${EPOCHREALTIME//[!0-9]/}; }
# REPLY = "1.2 s" since the microsecond timestamp $1.
seconds_since() {
  local start=$1 tenths
  now_us
  tenths=$(((REPLY - start) / 100000))
  REPLY="$((tenths / 10)).$((tenths % 10)) s"
}

parse_args() {
  while (($#)); do
    case $1 in
      -h | --help) usage; exit 0 ;;
      --hosts) (($# >= 2)) || die "--hosts needs a number"; HOSTS=$2; shift 2 ;;
      --hosts=*) HOSTS=${1#*=}; shift ;;
      --shape) (($# >= 2)) || die "--shape needs I:RATE[:in]"; SHAPES+=("$2"); shift 2 ;;
      --shape=*) SHAPES+=("${1#*=}"); shift ;;
      --tcp-over-links) TCP_OVER_LINKS=1; shift ;;
      --) shift; break ;;
      -*) usage >&2; die "unknown option $1" ;;
      *) break ;;
    esac
  done
  CMD=("$@")
  ((${#CMD[@]})) || { usage >&2; die "no CMD given"; }
  [[ $HOSTS =~ ^[1-8]$ ]] || die "--hosts must be 2..8 (1 is the default single host), not '$HOSTS'"
  ((TCP_OVER_LINKS == 0 || HOSTS > 1)) || die "--tcp-over-links needs --hosts N (N >= 2)"
  local spec
  for spec in "${SHAPES[@]}"; do
    ((HOSTS > 1)) || die "--shape needs --hosts N (N >= 2)"
    [[ $spec =~ ^([0-9]+):([0-9]+(\.[0-9]+)?[a-zA-Z]*)(:in|:out)?$ ]] || die "--shape wants I:RATE, I:RATE:in or I:RATE:out (e.g. 1:40mbit), not '$spec'"
    ((BASH_REMATCH[1] < HOSTS)) || die "--shape $spec: there is no host ${BASH_REMATCH[1]} (hosts are 0..$((HOSTS - 1)))"
  done
}

# rdma_rxe present natively: already loaded, or loadable. Setting up veths and rxe needs root.
kernel_has_rxe() {
  ((EUID == 0)) || return 1
  command -v rdma >/dev/null || return 1
  [[ -d /sys/module/rdma_rxe ]] || modprobe rdma_rxe 2>/dev/null
}

choose_mode() {
  case ${SOFTROCE_MODE:-auto} in
    native) ((EUID == 0)) || die "SOFTROCE_MODE=native needs root (veth and rxe setup)"; REPLY=native ;;
    vm) REPLY=vm ;;
    auto) if kernel_has_rxe; then REPLY=native; else REPLY=vm; fi ;;
    *) die "SOFTROCE_MODE must be auto, vm or native, not '$SOFTROCE_MODE'" ;;
  esac
}

# GRADLANE_OUT_DIR: the caller's SOFTROCE_OUT or a new directory, absolute (it is also the
# mount point inside the VM).
prepare_out_dir() {
  local dir=${SOFTROCE_OUT:-}
  if [[ -z $dir ]]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/softroce-out.XXXXXX")
    OUT_DIR_MADE=1
  fi
  mkdir -p "$dir"
  OUT_DIR=$(cd "$dir" && pwd -P)
}

# ---------------------------------------------------------------------------------------
# Native mode

run_native() {
  local t0 rc=0 mod
  local -a modules=(veth rdma_rxe rdma_ucm)
  ((HOSTS == 1)) || modules+=(bridge sch_tbf)
  now_us; t0=$REPLY
  # shellcheck source=softroce/net.sh
  source "$ASSETS/net.sh"
  trap 'softroce_net_down; report_out_dir' EXIT
  for mod in "${modules[@]}"; do
    [[ -d /sys/module/$mod ]] || modprobe "$mod" || die "modprobe $mod failed"
  done
  if ((HOSTS > 1)); then
    softroce_net_up_hosts "$HOSTS" || die "multi-host setup failed"
    softroce_net_shape "${SHAPES[@]}" || die "tc shaping failed"
    ((TCP_OVER_LINKS == 0)) || softroce_net_tcp_over_links "$HOSTS" || die "routing TCP over the links failed"
  else
    softroce_net_up_single || die "rxe setup failed"
  fi
  seconds_since "$t0"
  log "native: $SOFTROCE_DESCRIPTION ($REPLY)"
  ulimit -l unlimited 2>/dev/null || log "warning: cannot raise the memlock limit ($(ulimit -l) KiB)"
  export GRADLANE_DEVICE=$SOFTROCE_DEVICE GRADLANE_ADDR=$SOFTROCE_ADDR \
    GRADLANE_GID_INDEX=$SOFTROCE_GID_INDEX GRADLANE_HOSTS=$SOFTROCE_HOSTS \
    GRADLANE_OUT_DIR=$OUT_DIR GRADLANE_SOFTROCE=native
  now_us; t0=$REPLY
  "${CMD[@]}" || rc=$?
  seconds_since "$t0"
  local cmd_time=$REPLY
  seconds_since "$T_START"
  log "CMD exited $rc after $cmd_time (total $REPLY)"
  return "$rc"
}

# ---------------------------------------------------------------------------------------
# VM mode: kernel

can_run_apt_update() { ((EUID == 0)) || command -v sudo >/dev/null; }
apt_update() {
  local -a sudo=()
  ((EUID == 0)) || sudo=(sudo)
  log "apt-get update (the package lists don't know the kernel)"
  "${sudo[@]}" apt-get -qq update >&2
}

# The kernel package linux-image-amd64 points at (e.g. linux-image-6.1.0-56-amd64).
# apt-cache needs 0.8 s to load the lists, so the answer is remembered until they change.
resolve_kernel_package() {
  local stamp memo=$CACHE/linux-image-amd64.resolved memo_stamp memo_pkg
  if [[ -n ${SOFTROCE_KERNEL_PACKAGE:-} ]]; then
    REPLY=$SOFTROCE_KERNEL_PACKAGE
    return 0
  fi
  stamp=$(stat -c %Y /var/lib/apt/lists 2>/dev/null) || stamp=none
  if read -r memo_stamp memo_pkg 2>/dev/null <"$memo" && [[ $memo_stamp == "$stamp" && -n $memo_pkg ]]; then
    REPLY=$memo_pkg
    return 0
  fi
  REPLY=$(apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p')
  REPLY=${REPLY%%$'\n'*}
  [[ -n $REPLY ]] || return 1
  printf '%s %s\n' "$stamp" "$REPLY" >"$memo"
}

newest_cached_kernel() {
  local dir best=''
  for dir in "$CACHE"/kernel-*/.complete; do
    [[ -e $dir ]] || continue
    dir=${dir%/.complete}
    best=$(printf '%s\n' "$best" "${dir##*/kernel-}" | sort -V | tail -n1)
  done
  REPLY=$best
  [[ -n $best ]]
}

# bzImage -> vmlinux: qemu boots an uncompressed ELF through its PVH entry point, which
# skips SeaBIOS and the xz decompressor (3.5 s of the 5.5 s boot under TCG).
extract_pvh_image() {
  local bzimage=$1 out=$2 config=$3 offset
  grep -q '^CONFIG_PVH=y' "$config" 2>/dev/null || return 1
  command -v xz >/dev/null || return 1
  offset=$(LC_ALL=C grep -obUaP -m1 '\xfd7zXZ\x00' "$bzimage" | tr -d '\0') || return 1
  offset=${offset%%:*}
  # xz stops reading at the end of the stream: tail's SIGPIPE is expected, not an error.
  xz -dc --single-stream < <(tail -c +$((offset + 1)) "$bzimage") >"$out.tmp" 2>/dev/null || return 1
  mv "$out.tmp" "$out"
}

download_kernel() {
  local pkg=$1 dl=$CACHE/download tmp=$KROOT.tmp
  local -a apt_opts=(-qq)
  ((EUID != 0)) || apt_opts+=(-o APT::Sandbox::User=root) # root: no '_apt' sandbox warning
  rm -rf "$dl" "$tmp"
  mkdir -p "$dl"
  if ! (cd "$dl" && apt-get "${apt_opts[@]}" download "$pkg" >&2); then
    # Stale lists: the mirror no longer has the version they name.
    can_run_apt_update || die "apt-get download $pkg failed"
    apt_update || die "apt-get update failed"
    (cd "$dl" && apt-get "${apt_opts[@]}" download "$pkg" >&2) || die "apt-get download $pkg failed"
  fi
  dpkg-deb -x "$dl/${pkg}"_*.deb "$tmp"
  # The .deb ships no modules.dep; its postinst would make it (pitfall 1).
  depmod -b "$tmp" "$KVER"
  touch "$tmp/.complete"
  rm -rf "$KROOT" "$dl"
  mv "$tmp" "$KROOT"
}

# Other kernels (400 MB each, extracted) and their images go; images of this kernel built
# from another init.sh or module list (another checkout may still use them) go after a week.
prune_cache() {
  local entry
  for entry in "$CACHE"/kernel-* "$CACHE"/initramfs-*; do
    case ${entry##*/} in
      "kernel-$KVER" | "initramfs-$KVER-"*) ;;
      *) rm -rf "$entry" ;;
    esac
  done
  touch "$BASE_INITRD"
  find "$CACHE" -maxdepth 1 -name "initramfs-$KVER-*.cpio" -mtime +7 -delete
}

# Sets KVER, KROOT, KIMAGE and the base initramfs, under the cache lock: parallel runs
# share one download and never see a half-extracted kernel.
ensure_kernel() {
  local t0 pkg lock how
  now_us; t0=$REPLY
  CACHE=${SOFTROCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gradlane-softroce}
  mkdir -p "$CACHE"
  CACHE=$(cd "$CACHE" && pwd -P)
  exec {lock}>"$CACHE/lock"
  flock -w 900 "$lock" || die "cache $CACHE stayed locked for 900 s"
  if resolve_kernel_package; then
    pkg=$REPLY
  elif can_run_apt_update && apt_update && resolve_kernel_package; then
    pkg=$REPLY
  elif newest_cached_kernel; then
    pkg=linux-image-$REPLY
    log "cannot resolve linux-image-amd64; using the cached $pkg"
  else
    die "cannot resolve linux-image-amd64 (run ci/install-deps.sh, or apt-get update)"
  fi
  KVER=${pkg#linux-image-}
  KROOT=$CACHE/kernel-$KVER
  if [[ -e $KROOT/.complete ]]; then
    how=cached
  else
    download_kernel "$pkg"
    how="downloaded and unpacked"
  fi
  KIMAGE=$KROOT/boot/vmlinux-$KVER
  if [[ ! -e $KIMAGE ]] &&
    ! extract_pvh_image "$KROOT/boot/vmlinuz-$KVER" "$KIMAGE" "$KROOT/boot/config-$KVER"; then
    log "no PVH image (is xz installed?): booting the bzImage, about 3 s slower"
    KIMAGE=$KROOT/boot/vmlinuz-$KVER
  fi
  ensure_base_initramfs
  prune_cache
  exec {lock}>&-
  seconds_since "$t0"
  log "kernel $KVER $how, initramfs $BASE_HOW ($REPLY)"
}

# ---------------------------------------------------------------------------------------
# VM mode: initramfs = cached base (busybox, /init, modules) + per-run job archive.
# The kernel unpacks concatenated cpio archives in order.

# MODULE_PATHS = VM_MODULES and their dependencies, each after what it needs.
resolve_modules() {
  local moddir=$KROOT/lib/modules/$KVER line path name want optional
  local -A path_of=() deps_of=() builtin=() seen=()
  while IFS= read -r line; do
    path=${line%%:*}
    name=${path##*/}; name=${name%%.ko*}; name=${name//-/_}
    path_of[$name]=$path
    deps_of[$name]=${line#*:}
  done <"$moddir/modules.dep"
  while IFS= read -r path; do
    name=${path##*/}; name=${name%%.ko*}; builtin[${name//-/_}]=1
  done <"$moddir/modules.builtin"

  MODULE_PATHS=()
  visit() {
    local name=$1 dep dep_name
    [[ -z ${seen[$name]+x} ]] || return 0
    seen[$name]=1
    for dep in ${deps_of[$name]}; do
      dep_name=${dep##*/}; dep_name=${dep_name%%.ko*}
      visit "${dep_name//-/_}"
    done
    MODULE_PATHS+=("${path_of[$name]}")
  }
  for want in "${VM_MODULES[@]}"; do
    optional=${want%%[!?]*}
    want=${want#\?}
    if [[ -n ${path_of[$want]+x} ]]; then
      visit "$want"
    elif [[ -z ${builtin[$want]+x} && -z $optional ]]; then
      die "module $want is neither in modules.dep nor built into $KVER"
    fi
  done
}

static_busybox() {
  local bb
  bb=$(command -v busybox) || die "busybox not found (apt-get install busybox-static)"
  # ldd fails on a static binary.
  ! ldd "$bb" >/dev/null 2>&1 || die "$bb is dynamically linked; the initramfs needs busybox-static"
  REPLY=$bb
}

# Sets BASE_INITRD, BASE_KEY, BASE_HOW. Keyed by everything that goes in, so an edited
# init.sh or module list rebuilds it.
ensure_base_initramfs() {
  local bb key staging path
  static_busybox; bb=$REPLY
  key=$({
    echo "$KVER ${VM_MODULES[*]}"
    cat "$ASSETS/init.sh" "$bb"
  } | sha256sum)
  BASE_KEY=${key:0:16}
  BASE_INITRD=$CACHE/initramfs-$KVER-$BASE_KEY.cpio
  if [[ -s $BASE_INITRD ]]; then
    BASE_HOW=cached
    return 0
  fi
  resolve_modules
  staging=$WORK/base
  mkdir -p "$staging"/{bin,proc,sys,dev,tmp,softroce}
  cp "$bb" "$staging/bin/busybox"
  cp "$ASSETS/init.sh" "$staging/init"
  chmod 0755 "$staging/init" "$staging/bin/busybox"
  for path in "${MODULE_PATHS[@]}"; do
    mkdir -p "$staging/lib/modules/$KVER/${path%/*}"
    cp "$KROOT/lib/modules/$KVER/$path" "$staging/lib/modules/$KVER/$path"
  done
  printf '%s\n' "${MODULE_PATHS[@]}" >"$staging/modules.list"
  # Uncompressed: unpacking gzip costs more under TCG than qemu's fw_cfg copy of the bytes.
  (cd "$staging" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) \
    >"$BASE_INITRD.tmp"
  mv "$BASE_INITRD.tmp" "$BASE_INITRD"
  BASE_HOW="built (${#MODULE_PATHS[@]} modules)"
}

# Names of the caller's variables that CMD sees inside the VM.
pass_env() {
  local name
  SR_ENV=()
  for name in $(compgen -e); do
    case $name in
      PATH | HOME | USER | LOGNAME | LANG | LANGUAGE | LC_* | TZ | TERM | CI) ;;
      LD_LIBRARY_PATH | *SAN_OPTIONS | RDMAV_* | IBV_* | GRADLANE_* | GTEST_*) ;;
      *) [[ " ${SOFTROCE_PASS_ENV:-} " == *" $name "* ]] || continue ;;
    esac
    SR_ENV+=("$name=${!name}")
  done
}

# The per-run archive: guest scripts, what to run (job.env) and where the results go.
write_job_initramfs() {
  local job=$WORK/job/softroce
  mkdir -p "$job"
  cp "$ASSETS/guest.sh" "$ASSETS/net.sh" "$job/"
  printf '%s\n' "$OUT_DIR" >"$job/out_dir"
  pass_env
  # shellcheck disable=SC2034 # read by guest.sh
  local -a SR_CMD=("${CMD[@]}") SR_SHAPES=("${SHAPES[@]}")
  # shellcheck disable=SC2034
  local SR_CWD=$PWD SR_HOSTS=$HOSTS SR_OUT=$OUT_DIR SR_TCP_OVER_LINKS=$TCP_OVER_LINKS
  declare -p SR_CMD SR_CWD SR_ENV SR_HOSTS SR_SHAPES SR_OUT SR_TCP_OVER_LINKS >"$job/job.env"
  (cd "$WORK/job" && find softroce | cpio -o -H newc -R 0:0 --quiet) >"$WORK/job.cpio"
  cat "$BASE_INITRD" "$WORK/job.cpio" >"$WORK/initrd"
}

# ---------------------------------------------------------------------------------------
# VM mode: boot and relay

# Guest status lines (port 3) -> "softroce: ..." lines with host timings.
relay_status() {
  local t_qemu=$1 line
  while IFS= read -r line; do
    case $line in
      "up "*) seconds_since "$t_qemu"; log "VM up, ${line#up } ($REPLY)" ;;
      "fail "*) log "guest: ${line#fail }" ;;
    esac
  done
}

show_console_tail() {
  # The first report of a guest kernel that failed (its cause and first frames), which the
  # tail of a long stack dump would not include.
  local first
  first=$(grep -n -m1 -E 'BUG:|Oops|WARNING:|watchdog:|rcu: INFO|Kernel panic|general protection' "$WORK/console.log" |
    cut -d: -f1) || true
  if [[ -n $first ]]; then
    echo "---- the VM's kernel reported, from line $first of its console ----" >&2
    sed -n "$((first > 5 ? first - 5 : 1)),$((first + 30))p" "$WORK/console.log" >&2 || true
  fi
  echo "---- last 60 lines of the VM console ----" >&2
  tail -n 60 "$WORK/console.log" >&2 || true
  if [[ -s $WORK/qemu.err ]]; then
    echo "---- qemu's stderr ----" >&2
    cat "$WORK/qemu.err" >&2
  fi
  echo "----" >&2
}

boot_vm() {
  local timeout_s=${SOFTROCE_TIMEOUT:-1500} mem=${SOFTROCE_MEM:-2048} smp=${SOFTROCE_SMP:-2}
  local -a accel qemu
  # shellcheck disable=SC2054 # commas are qemu's option syntax
  case ${SOFTROCE_ACCEL:-tcg} in
    # -smp 1 makes busy-polling client/server pairs wait a 250 Hz tick: ~4 ms latency
    # (pitfall 9). KVM here is PVM, which hangs or aborts (pitfall 8), hence opt-in.
    tcg) accel=(-accel tcg,thread=multi -cpu max) ;;
    kvm) accel=(-enable-kvm -cpu host) ;;
    *) die "SOFTROCE_ACCEL must be tcg or kvm" ;;
  esac
  [[ $timeout_s =~ ^[0-9]+$ ]] || die "SOFTROCE_TIMEOUT must be whole seconds"
  : >"$WORK/stdout"; : >"$WORK/stderr"; : >"$WORK/status"; : >"$WORK/console.log"
  # shellcheck disable=SC2054
  qemu=(qemu-system-x86_64 "${accel[@]}" -m "$mem" -smp "$smp"
    -nodefaults -display none -no-reboot -nic none
    -kernel "$KIMAGE" -initrd "$WORK/initrd"
    # panic=-1 + -no-reboot: a guest panic ends qemu instead of hanging until the timeout.
    # tsc=reliable: the boot-time sync check sees TCG's vCPU TSCs warp and falls back to
    # hpet, where every clock_gettime is a syscall + emulated MMIO read (9.7 us instead of
    # 1.3 us): that would swamp a ~20 us latency measurement.
    # no_timer_check: under a loaded TCG host the boot-time check of the IO-APIC timer can see
    # no tick in its window and panic ("IO-APIC + timer doesn't work!").
    -append "console=ttyS0 panic=-1 loglevel=4 tsc=reliable no_timer_check ${SOFTROCE_APPEND:-}"
    # multidevs=remap: / spans several host filesystems; without it inode numbers collide.
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
    -virtfs "local,path=${OUT_DIR//,/,,},mount_tag=out,security_model=none,multidevs=remap"
    -device virtio-serial-pci,id=ports
    -chardev "file,id=cmd_out,path=$WORK/stdout" -device virtserialport,bus=ports.0,nr=1,chardev=cmd_out
    -chardev "file,id=cmd_err,path=$WORK/stderr" -device virtserialport,bus=ports.0,nr=2,chardev=cmd_err
    -chardev "file,id=status,path=$WORK/status" -device virtserialport,bus=ports.0,nr=3,chardev=status
    -serial "file:$WORK/console.log" -monitor none)

  local t_qemu qemu_rc=0 tail_out tail_err tail_status
  now_us; t_qemu=$REPLY
  timeout -k 10 "$timeout_s" "${qemu[@]}" </dev/null 2>"$WORK/qemu.err" &
  QEMU_PID=$!
  # Live relay. tail --pid reads what is left once qemu is gone, then exits.
  tail -c +1 -s 0.1 -f --pid="$QEMU_PID" "$WORK/stdout" &
  tail_out=$!
  tail -c +1 -s 0.1 -f --pid="$QEMU_PID" "$WORK/stderr" >&2 &
  tail_err=$!
  tail -c +1 -s 0.1 -f --pid="$QEMU_PID" "$WORK/status" | relay_status "$t_qemu" &
  tail_status=$!
  wait "$QEMU_PID" || qemu_rc=$?
  QEMU_PID=''
  wait "$tail_out" "$tail_err" "$tail_status" || true

  local line started='' rc='' cmd_cs=0 vm_time
  while read -r line; do
    case $line in
      "up "*) started=1 ;;
      "rc "*) read -r _ rc cmd_cs <<<"$line" ;;
    esac
  done <"$WORK/status"
  seconds_since "$t_qemu"; vm_time=$REPLY

  if [[ -n $rc ]]; then
    seconds_since "$T_START"
    log "CMD exited $rc after $((cmd_cs / 100)).$((cmd_cs % 100 / 10)) s (VM $vm_time, total $REPLY)"
    return "$rc"
  fi
  if ((qemu_rc == 124 || qemu_rc == 137)); then
    log "timed out after $timeout_s s (SOFTROCE_TIMEOUT)"
  elif [[ -z $started ]]; then
    log "VM did not start CMD (qemu exit code $qemu_rc after $vm_time)"
    BOOT_FAILED=1
  else
    log "CMD did not report an exit code: the VM died under it (qemu exit code $qemu_rc after $vm_time)"
  fi
  show_console_tail
  return "$EXIT_HARNESS"
}

# A results directory we made: gone if CMD left nothing in it, otherwise named.
report_out_dir() {
  [[ -n $OUT_DIR_MADE ]] || return 0
  rmdir "$OUT_DIR" 2>/dev/null || log "results in $OUT_DIR"
}

on_exit() {
  if [[ -n $QEMU_PID ]]; then
    kill -TERM "$QEMU_PID" 2>/dev/null || true # timeout passes it on to qemu
    wait "$QEMU_PID" 2>/dev/null || true
  fi
  if [[ -n $WORK ]]; then
    if [[ -n ${SOFTROCE_KEEP:-} ]]; then
      log "kept $WORK"
    else
      rm -rf "$WORK"
    fi
  fi
  report_out_dir
}

run_vm() {
  local tool
  for tool in qemu-system-x86_64 cpio depmod dpkg-deb apt-get apt-cache timeout tail flock sha256sum; do
    command -v "$tool" >/dev/null || die "$tool not found: run ci/install-deps.sh"
  done
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/softroce.XXXXXX")
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  ensure_kernel
  write_job_initramfs
  local rc=0
  BOOT_FAILED=''
  boot_vm || rc=$?
  # A guest that never reached CMD (a boot panic) is booted once more: CMD had not run, so
  # nothing runs twice.
  if ((rc == EXIT_HARNESS)) && [[ -n $BOOT_FAILED ]]; then
    log "booting the VM once more"
    rc=0
    boot_vm || rc=$?
  fi
  return "$rc"
}

main() {
  now_us; T_START=$REPLY
  parse_args "$@"
  choose_mode
  local mode=$REPLY
  trap report_out_dir EXIT
  prepare_out_dir
  if [[ $mode == native ]]; then
    run_native
  else
    run_vm
  fi
}

main "$@"
