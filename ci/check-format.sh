#!/usr/bin/env bash
# Checks that every tracked C++ file is formatted as .clang-format says (Debian's clang-format).
# One check per file; prints the files that differ, with the command that fixes them, then
# `format: N passed, M failed`. Exits non-zero if any file differs.
#   bash ci/check-format.sh [ROOT]
set -euo pipefail
ROOT=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)
cd "$ROOT"
command -v clang-format >/dev/null || { echo "format: 0 passed, 1 failed (no clang-format: ci/install-deps.sh installs it)"; exit 1; }
passed=0 failed=0
while IFS= read -r file; do
  if clang-format --dry-run --Werror "$file" >/dev/null 2>&1; then
    passed=$((passed + 1))
  else
    echo "not formatted: $file (clang-format -i $file)" >&2
    failed=$((failed + 1))
  fi
done < <(git ls-files '*.cpp' '*.hpp' '*.h')
echo "format: $passed passed, $failed failed"
((failed == 0))
