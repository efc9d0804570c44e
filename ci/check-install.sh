#!/usr/bin/env bash
# Installs the built tree into a scratch prefix and builds the README example against it twice:
# once through CMake's find_package(gradlane), once through pkg-config. Prints
# `install: N passed, M failed`. Usage: ci/check-install.sh BUILD_DIR
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: check-install.sh BUILD_DIR}
PREFIX=$(mktemp -d /tmp/gradlane-install.XXXXXX)
trap 'rm -rf "$PREFIX"' EXIT
passed=0; failed=0
check() {  # NAME CMD...
  local name=$1; shift
  if "$@" > "$PREFIX/$name.log" 2>&1; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "install: $name failed:" >&2; tail -20 "$PREFIX/$name.log" >&2; fi
}
check cmake-install cmake --install "$BUILD" --prefix "$PREFIX/usr"
check find-package sh -c "cmake -S '$ROOT/tests/install' -B '$PREFIX/consumer' -DCMAKE_PREFIX_PATH='$PREFIX/usr' \
  -DEXAMPLE_SOURCE='$ROOT/examples/push_update.cpp' && cmake --build '$PREFIX/consumer'"
check pkg-config sh -c "PKG_CONFIG_PATH='$PREFIX/usr/lib/pkgconfig:$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig' && export PKG_CONFIG_PATH && \
  c++ '$ROOT/examples/push_update.cpp' -o '$PREFIX/push_update_pc' \$(pkg-config --static --cflags --libs gradlane)"
echo "install: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
