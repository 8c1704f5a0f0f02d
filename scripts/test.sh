#!/usr/bin/env bash
# The test command: install, then ruff, mypy --strict, the import layers (import-linter) and
# pytest (unit + integration).
# Every step runs even if an earlier one failed; exits 1 if any failed.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k loader -x`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install.sh

BIN="$ROOT/.venv/bin"
failed=()

step() {
    local name="$1"
    shift
    printf '\n== %s: %s\n' "$name" "$*"
    local rc=0
    "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        printf '== %s FAILED (exit %d)\n' "$name" "$rc"
        failed+=("$name")
    fi
    return 0
}

lint_paths=()
for path in agent tests bench demo; do
    [ -e "$path" ] && lint_paths+=("$path")
done

step ruff "$BIN/ruff" check "${lint_paths[@]}"
step mypy "$BIN/mypy"
# the layers of pyproject.toml's [tool.importlinter] (which package may import which; no cycles)
step import-layers "$BIN/lint-imports" --no-cache
# pytest exits 5 when it collected no tests: that is a failure here too.
step pytest "$BIN/pytest" "$@"

echo
if [ "${#failed[@]}" -gt 0 ]; then
    echo "test.sh: FAILED: ${failed[*]}"
    exit 1
fi
echo "test.sh: all checks passed"
