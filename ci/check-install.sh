#!/usr/bin/env bash
# How an embedder meets gradlane, checked on the built tree:
#   - `cmake --install` into a scratch prefix, then the README example built against it through
#     CMake's find_package(gradlane) (by a consumer that sets no C++ standard) and through the
#     README's exact pkg-config line;
#   - a library-only build (no daemon, tests, perf or examples; CLI11, nlohmann_json, GoogleTest
#     and Google Benchmark made unfindable) configures and builds the gradlane target;
#   - the installed Python package imports with Debian's python3;
#   - `ctest -N` in the build directory lists the unit and softroce suites;
#   - the installed systemd unit names the installed gradlaned and passes systemd-analyze verify.
# Prints `install: N passed, M failed`. Usage: ci/check-install.sh BUILD_DIR
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: check-install.sh BUILD_DIR}
SCRATCH=$(mktemp -d /tmp/gradlane-install.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
PREFIX=$SCRATCH/usr
passed=0; failed=0
check() {  # NAME CMD...
  local name=$1; shift
  if "$@" > "$SCRATCH/$name.log" 2>&1; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "install: $name failed:" >&2; tail -20 "$SCRATCH/$name.log" >&2; fi
}
check cmake-install cmake --install "$BUILD" --prefix "$PREFIX"
# Every installed program starts from the prefix alone (its RUNPATH finds libgradlane).
check installed-programs sh -c "for p in '$PREFIX'/bin/*; do env -u LD_LIBRARY_PATH \"\$p\" --help > /dev/null || \
  { echo \"\$p --help failed\"; exit 1; }; done; test -x '$PREFIX/bin/gradlaned'"
# The systemd unit as installed, with its ExecStart at this prefix's gradlaned; verify must
# not complain at all (it only warns, exit 0, on a directive it ignores).
check systemd-unit sh -c "grep -qx 'ExecStart=$PREFIX/bin/gradlaned .*' '$PREFIX/lib/systemd/system/gradlaned.service' && \
  said=\$(systemd-analyze verify '$PREFIX/lib/systemd/system/gradlaned.service' 2>&1) && \
  { [ -z \"\$said\" ] || { echo \"\$said\"; false; }; }"
check find-package sh -c "cmake -S '$ROOT/tests/install' -B '$SCRATCH/consumer' -DCMAKE_PREFIX_PATH='$PREFIX' \
  -DEXAMPLE_SOURCE='$ROOT/examples/push_update.cpp' && cmake --build '$SCRATCH/consumer'"
# The README's line, verbatim: `pkg-config --cflags --libs gradlane`.
readme_line=$(grep -o 'pkg-config --cflags --libs gradlane' "$ROOT/README.md" | head -1)
check pkg-config sh -c "test -n '$readme_line' && \
  PKG_CONFIG_PATH='$PREFIX/lib/pkgconfig:$PREFIX/lib/x86_64-linux-gnu/pkgconfig' && export PKG_CONFIG_PATH && \
  c++ '$ROOT/examples/push_update.cpp' -o '$SCRATCH/push_update_pc' \$($readme_line)"
check library-only sh -c "cmake -S '$ROOT' -B '$SCRATCH/library-only' -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGRADLANE_BUILD_TESTS=OFF -DGRADLANE_BUILD_PERF=OFF -DGRADLANE_BUILD_DAEMON=OFF -DGRADLANE_BUILD_EXAMPLES=OFF -DGRADLANE_BUILD_TRAINER=OFF \
  -DGRADLANE_BUILD_PYTHON=OFF \
  -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON \
  && cmake --build '$SCRATCH/library-only' --target gradlane -j\$(nproc)"
# The Python package as installed: Debian's python3 imports it from the prefix's dist-packages,
# and its extension finds the prefix's libgradlane (RUNPATH), without LD_LIBRARY_PATH.
check python-package sh -c "cd '$SCRATCH' && env -u LD_LIBRARY_PATH PYTHONPATH=\$(echo '$PREFIX'/lib/python3.*/dist-packages) \
  /usr/bin/python3 -c 'import gradlane, sys; sys.exit(0 if issubclass(gradlane.Error, RuntimeError) else 1)'"
check ctest-lists-suites sh -c "ctest --test-dir '$BUILD' -N -L unit | grep -q 'Total Tests: [1-9]' && \
  ctest --test-dir '$BUILD' -N -L softroce | grep -q 'Total Tests: 1'"
echo "install: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
