#!/usr/bin/env bash
# Install what gradlane needs to build, what ci/fuzz.sh and ci/softroce.sh need to run, on Debian 12.
# Idempotent: when every package is already installed it touches neither the network nor
# dpkg, so rerunning it costs a dpkg-query. Root, or sudo when it exists.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: ci/install-deps.sh [-n] [-h]

Installs (apt-get install --no-install-recommends) the build dependencies, the fuzzing
toolchain (ci/fuzz.sh) and the Soft-RoCE harness dependencies that are missing; runs
`apt-get update` once first.
  -n  only print the missing packages, install nothing (exit 1 if any are missing)
EOF
}

readonly BUILD_DEPS=(
  g++ cmake make pkg-config
  libibverbs-dev librdmacm-dev
  libboost-dev libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev libsodium-dev libsystemd-dev libxxhash-dev prometheus-cpp-dev
  gnuplot-nox python3
  systemd
  zlib1g-dev dataset-fashion-mnist
  pybind11-dev python3-dev python3-numpy
  python3-torch
)
# ci/fuzz.sh: libFuzzer. clang brings the compiler (clang-14); libclang-rt-14-dev holds the
# fuzzer and sanitizer runtimes (libclang_rt.fuzzer-x86_64.a), which clang-14 does not pull in
# without recommends.
readonly FUZZ_DEPS=(clang libclang-rt-14-dev)
# ci/check-format.sh: the C++ style of .clang-format.
readonly FORMAT_DEPS=(clang-format)
# Not rdma-core: it only carries udev rules and daemons, and Depends: udev pulls systemd in.
# libibverbs1/librdmacm1 and the rxe provider come with ibverbs-providers and the utils.
# xz-utils: ci/softroce.sh unpacks the kernel's vmlinux to boot it without SeaBIOS (3 s less).
# openmpi-bin, slurmd/slurmctld/slurm-client/munge: the launcher tests start a job with mpirun and
# with srun on a one-node Slurm cluster inside the harness (tests/python/launchers_softroce_test.py).
readonly HARNESS_DEPS=(
  qemu-system-x86 busybox-static kmod cpio gzip xz-utils iproute2
  ibverbs-providers ibverbs-utils rdmacm-utils perftest
  openmpi-bin slurmd slurmctld slurm-client munge
)

log() { printf 'install-deps: %s\n' "$*" >&2; }

# MISSING = the packages of "$@" that dpkg does not have fully installed.
find_missing() {
  local -A installed=()
  local name status
  # Unknown packages make dpkg-query complain and exit 1; they simply count as missing.
  while read -r name status; do
    [[ $status == ii* ]] && installed[$name]=1
  done < <(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "$@" 2>/dev/null || true)
  MISSING=()
  for name in "$@"; do
    [[ -n ${installed[$name]+x} ]] || MISSING+=("$name")
  done
}

# SUDO = how to become root for apt-get.
find_root() {
  SUDO=()
  ((EUID == 0)) && return 0
  command -v sudo >/dev/null || {
    log "not root and no sudo: install as root: apt-get install ${MISSING[*]}"
    exit 1
  }
  SUDO=(sudo)
}

main() {
  local dry_run="" opt
  while getopts 'nh' opt; do
    case $opt in
      n) dry_run=1 ;;
      h) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
  done

  find_missing "${BUILD_DEPS[@]}" "${FUZZ_DEPS[@]}" "${FORMAT_DEPS[@]}" "${HARNESS_DEPS[@]}"
  if ((${#MISSING[@]} == 0)); then
    log "all $((${#BUILD_DEPS[@]} + ${#FUZZ_DEPS[@]} + ${#FORMAT_DEPS[@]} + ${#HARNESS_DEPS[@]})) packages already installed"
    return 0
  fi
  log "missing: ${MISSING[*]}"
  [[ -z $dry_run ]] || return 1

  find_root
  local start=$SECONDS
  # Lock timeout: another apt run (unattended-upgrades, a parallel job) makes us wait, not fail.
  local -a apt=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q
    -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)
  "${apt[@]}" update
  "${apt[@]}" install -y --no-install-recommends "${MISSING[@]}"

  find_missing "${BUILD_DEPS[@]}" "${HARNESS_DEPS[@]}"
  if ((${#MISSING[@]})); then
    log "still missing after apt-get install: ${MISSING[*]}"
    exit 1
  fi
  log "installed in $((SECONDS - start)) s"
}

main "$@"
