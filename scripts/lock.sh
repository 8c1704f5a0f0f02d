#!/usr/bin/env bash
# Refresh the dependency locks in requirements/ from pyproject.toml (the one command for it):
#
#   requirements/test.txt     the runtime and test dependencies: what scripts/install.sh puts
#                             in .venv for the README's two commands (runtime + [test])
#   requirements/runtime.txt  the runtime dependencies only, at the same versions: the image
#   requirements/build.txt    the build backend (pyproject.toml's [build-system] requires) at
#                             test.txt's version: the image builds certagent's wheel with it,
#                             without build isolation (nothing unpinned is fetched to build)
#   requirements/lowest.txt   the lowest versions pyproject.toml admits of each direct runtime
#                             dependency, with the locked mypy: scripts/test.sh type-checks
#                             against it too (Python 3.11), so a floor that is too low shows
#
# Made by uv (pinned below) with `uv pip compile --universal --generate-hashes`: one lock for
# every Python the project supports (3.11 on Debian 12, 3.13 on Debian 13), every file of each
# pinned release hashed, installed by plain pip (`pip install --require-hashes --no-deps`).
#
#   bash scripts/lock.sh            keep every pin pyproject.toml still admits; add what is new
#   bash scripts/lock.sh --upgrade  the newest releases pyproject.toml admits (what the canary,
#                                   CERTAGENT_TEST_LATEST=1 bash scripts/test.sh, tested)
#   bash scripts/lock.sh --upgrade-package redis   only that one (repeatable)
#
# uv is installed into .venv-tools (not part of the project's environment) on first use.
set -euo pipefail

UV_VERSION=0.13.10
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TOOLS="$ROOT/.venv-tools"
PYTHON="${PYTHON:-python3}"

say() { printf 'lock: %s\n' "$*"; }
die() { printf 'lock: error: %s\n' "$*" >&2; exit 1; }

upgrade=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --upgrade) upgrade+=(--upgrade) ;;
        --upgrade-package)
            [ "$#" -ge 2 ] || die "--upgrade-package needs a package name"
            upgrade+=(--upgrade-package "$2")
            shift
            ;;
        -h | --help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (--upgrade, --upgrade-package NAME)" ;;
    esac
    shift
done

if [ "$("$TOOLS/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    say "installing uv $UV_VERSION into .venv-tools"
    [ -x "$TOOLS/bin/python" ] || "$PYTHON" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi
UV="$TOOLS/bin/uv"

# --native-tls: the machine's trust store (a proxy's CA among its anchors) as pip uses it.
# --no-config: no uv.toml of the user's changes what the lock says.
common=(pip compile --quiet --no-config --native-tls --generate-hashes
    --custom-compile-command "bash scripts/lock.sh" --python-version 3.11)
mkdir -p requirements

say "requirements/test.txt: runtime + [test], every supported Python"
"$UV" "${common[@]}" --universal "${upgrade[@]}" --extra test pyproject.toml -o requirements/test.txt

say "requirements/runtime.txt: the runtime dependencies at the versions of test.txt"
"$UV" "${common[@]}" --universal -c requirements/test.txt pyproject.toml -o requirements/runtime.txt

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
say "requirements/build.txt: [build-system] requires at the versions of test.txt"
"$PYTHON" -c 'import sys, tomllib; print(*tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"], sep="\n")' \
    pyproject.toml >"$work/build.in"
"$UV" "${common[@]}" --universal -c requirements/test.txt "$work/build.in" -o requirements/build.txt
sed -i "s|$work/build.in|pyproject.toml's [build-system] requires|" requirements/build.txt

# The lowest versions of the direct dependencies (their own dependencies as they resolve),
# with the type checker of test.txt: only mypy runs in this environment.
mypy_pin="$(grep -E '^mypy==' requirements/test.txt | cut -d' ' -f1)"
[ -n "$mypy_pin" ] || die "requirements/test.txt has no mypy pin"
printf '%s\n' "$mypy_pin" >"$work/mypy.in"
say "requirements/lowest.txt: the lowest direct runtime dependencies + $mypy_pin (Python 3.11)"
"$UV" "${common[@]}" --resolution lowest-direct pyproject.toml "$work/mypy.in" \
    -o requirements/lowest.txt
# uv names the temporary input in the "via" comments; say what it was instead
sed -i "s|$work/mypy.in|the locked mypy (scripts/lock.sh)|" requirements/lowest.txt

say "done: $(grep -cE '^[a-z0-9]' requirements/test.txt) packages in test.txt," \
    "$(grep -cE '^[a-z0-9]' requirements/runtime.txt) in runtime.txt," \
    "$(grep -cE '^[a-z0-9]' requirements/build.txt) in build.txt," \
    "$(grep -cE '^[a-z0-9]' requirements/lowest.txt) in lowest.txt; review with git diff requirements/"
