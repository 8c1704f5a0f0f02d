#!/usr/bin/env bash
# The test command: install, then ruff, mypy --strict, the import layers (import-linter)
# and pytest on each HAProxy of the version matrix:
#
#   2.6  Debian 12's own (PATH)              the whole suite (unit + integration)
#   3.0  Debian 13 (trixie)                  the integration tests that start HAProxy,
#                                            but the heavy ones
#   3.2  Debian unstable (sid)               the same
#   3.4  Debian experimental                 the runtime-API integration tests
#
# The machine's own HAProxy (PATH) runs the whole suite: 2.6 on Debian 12; on Debian 13 it is
# 3.0, and 2.6 is then Debian 12's package, run like 3.0 above. The other binaries come from
# Debian's packages, made runnable here and cached outside the checkout by
# scripts/haproxy-versions.sh (the first run builds the cache, ~4 min); pytest picks each
# through CERTAGENT_TEST_HAPROXY and names it in its header. Which tests each run leaves out,
# and why, is in tests/conftest.py (marks no_haproxy, heavy, own_builds and runtime_api).
#
# Last, the Docker checks (tests/docker: the images, the compose demo with Compose v1 and
# v2, scripts/docker-test.sh) when a Docker engine answers or can be started
# (scripts/docker-engine.sh); otherwise the step says why it did not run.
# CERTAGENT_TEST_DOCKER=0 leaves them out, =1 makes a missing engine a failure (.ci/run).
#
# Every step runs even if an earlier one failed; exits 1 if any failed. Extra arguments go
# to every pytest run, e.g. `bash scripts/test.sh -k loader -x`; with extra arguments a 3.x
# run that selects no test is reported and passes. CERTAGENT_TEST_VERSIONS="2.6 3.2" runs
# only those versions.
#
# The environment is .venv, exactly the lock requirements/test.txt (scripts/install.sh checks
# it); mypy also runs in .venv-lowest, the lowest versions pyproject.toml admits
# (requirements/lowest.txt; Python 3.11 only). CERTAGENT_TEST_LATEST=1 is the canary: the same
# checks in .venv-latest, with the newest releases pyproject.toml allows instead of the lock,
# listing the packages that differ from it (README, "Dependencies": from a canary to a new lock).
#
# Each pytest run spreads its test modules over CERTAGENT_TEST_WORKERS processes (pytest-xdist,
# --dist loadfile: a module's tests stay together; default 2): one worker left half of a 2-CPU
# machine idle, waiting on HAProxy, Redis, pebble and timeouts. 0 runs everything in one process.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
START=$SECONDS
WORKERS="${CERTAGENT_TEST_WORKERS:-2}"
[[ "$WORKERS" =~ ^[0-9]+$ ]] || { echo "CERTAGENT_TEST_WORKERS=$WORKERS: give a number (0: no workers)" >&2; exit 2; }
WORKER_ARGS=(-n "$WORKERS")
[ "$WORKERS" -eq 0 ] || WORKER_ARGS+=(--dist loadfile)

LATEST="${CERTAGENT_TEST_LATEST:-}"
[ "$LATEST" != 0 ] || LATEST=""
if [ -n "$LATEST" ]; then
    bash scripts/install.sh --test --latest
    BIN="$ROOT/.venv-latest/bin"
    echo "== the canary: newest releases in .venv-latest, not the lock (CERTAGENT_TEST_LATEST=$LATEST)"
else
    bash scripts/install.sh --test
    BIN="$ROOT/.venv/bin"
fi
VERSIONS="${CERTAGENT_TEST_VERSIONS:-2.6 3.0 3.2 3.4}"
failed=()
timings=()

step() {
    local name="$1"
    shift
    if [ "$1" = pytest_on ]; then printf '\n== %s\n' "$name"; else printf '\n== %s: %s\n' "$name" "$*"; fi
    local rc=0 began=$SECONDS
    "$@" || rc=$?
    timings+=("$name $((SECONDS - began))s")
    if [ "$rc" -ne 0 ]; then
        printf '== %s FAILED (exit %d)\n' "$name" "$rc"
        failed+=("$name")
    fi
    return 0
}

# pytest on one HAProxy: $1 the binary ("" = PATH's), the rest pytest's arguments.
# pytest exits 5 when it collected no tests: a failure, except on a 3.x run narrowed by the
# caller's own arguments.
pytest_on() {
    local haproxy="$1" rc=0
    shift
    printf '== CERTAGENT_TEST_HAPROXY=%s pytest --durations=15 %s %s\n' "$haproxy" "${WORKER_ARGS[*]}" "$*"
    # --durations: which tests dominate each run's time, in every log
    CERTAGENT_TEST_HAPROXY="$haproxy" "$BIN/pytest" --durations=15 "${WORKER_ARGS[@]}" "$@" || rc=$?
    if [ "$rc" -eq 5 ] && [ -n "$haproxy" ] && [ "$EXTRA" -gt 0 ]; then
        echo "no test of this run matches the arguments given: nothing to run on $haproxy"
        return 0
    fi
    return "$rc"
}
EXTRA=$#

lint_paths=()
for path in agent tests bench demo docker; do
    [ -e "$path" ] && lint_paths+=("$path")
done

step ruff "$BIN/ruff" check "${lint_paths[@]}"
step mypy "$BIN/mypy"
if [ -z "$LATEST" ] && [ -x "$ROOT/.venv-lowest/bin/mypy" ]; then
    # the same code against the lowest releases pyproject.toml admits: a typing difference
    # (or an API used that a floor lacks) between the two ends of a range shows here
    step "mypy, lowest versions" "$ROOT/.venv-lowest/bin/mypy" \
        --cache-dir .mypy_cache/lowest
fi
# the layers of pyproject.toml's [tool.importlinter] (which package may import which; no cycles)
step import-layers "$BIN/lint-imports" --no-cache

# the machine's own HAProxy: 2.6 on Debian 12, 3.0 on Debian 13
OWN="$(haproxy -v 2>/dev/null | sed -n '1s/^HAProxy version \([0-9]*\.[0-9]*\).*/\1/p')"
declare -A SUITE=([2.6]=bookworm [3.0]=trixie [3.2]=sid [3.4]=experimental)
declare -A BUILT=()
wanted=()
for version in $VERSIONS; do
    [ -n "${SUITE[$version]:-}" ] || { echo "unknown version $version (2.6 3.0 3.2 3.4)" >&2; exit 2; }
    [ "$version" = "$OWN" ] || wanted+=("${SUITE[$version]}")
done
if [ "${#wanted[@]}" -gt 0 ]; then
    printf '\n== HAProxy builds: scripts/haproxy-versions.sh %s\n' "${wanted[*]}"
    versions_out="$(bash scripts/haproxy-versions.sh "${wanted[@]}")" || true
    printf '%s\n' "$versions_out"
    while read -r suite path _; do
        [[ "$path" == /* ]] && BUILT[$suite]="$path"
    done <<<"$versions_out"
fi

for version in $VERSIONS; do
    if [ "$version" = "$OWN" ]; then
        step "pytest, HAProxy $version (this machine's, Debian $(. /etc/os-release && echo "$VERSION_ID")): the whole suite" \
            pytest_on "" "$@"
        continue
    fi
    case "$version" in
        2.6 | 3.0 | 3.2)
            suite="${SUITE[$version]}"
            if [ -z "${BUILT[$suite]:-}" ]; then
                echo "== HAProxy $version (Debian $suite) could not be built: see above"
                failed+=("HAProxy $version build")
                continue
            fi
            step "pytest, HAProxy $version (Debian $suite): integration tests that start HAProxy, but the heavy ones" \
                pytest_on "${BUILT[$suite]}" -m "integration and not no_haproxy and not heavy and not own_builds" "$@"
            ;;
        3.4)
            if [ -z "${BUILT[experimental]:-}" ]; then
                # Debian experimental may have no haproxy at some point: said, never skipped quietly
                echo "== HAProxy 3.4 (Debian experimental) could not be built: its runtime-API"
                echo "   run is NOT done (see above); the other versions are tested as usual"
                continue
            fi
            step "pytest, HAProxy 3.4 (Debian experimental): runtime-API integration tests" \
                pytest_on "${BUILT[experimental]}" -m "integration and runtime_api" "$@"
            ;;
    esac
done

# The Docker checks, last: with an engine that answers, or one scripts/docker-engine.sh starts
# (and stops by its PID once no run uses it); exit 75 from it means no engine could be had.
DOCKER_MODE="${CERTAGENT_TEST_DOCKER:-auto}"
not_run=()
docker_checks() {
    local rc=0
    bash scripts/docker-engine.sh run bash scripts/docker-test.sh "$BIN/pytest" "$@" || rc=$?
    if [ "$rc" -eq 75 ]; then
        if [ "$DOCKER_MODE" = 1 ]; then
            echo "no Docker engine (the reason above), and CERTAGENT_TEST_DOCKER=1 asks for one"
            return 1
        fi
        echo "the Docker checks did NOT run: no Docker engine (the reason above)"
        not_run+=("the Docker checks (no Docker engine: see their step)")
        return 0
    fi
    return "$rc"
}
if [ "$DOCKER_MODE" = 0 ]; then
    printf '\n== Docker checks: left out (CERTAGENT_TEST_DOCKER=0)\n'
    not_run+=("the Docker checks (CERTAGENT_TEST_DOCKER=0)")
else
    step "Docker checks (tests/docker)" docker_checks "$@"
fi

echo
printf 'test.sh: %s\n' "${timings[@]}"
printf 'test.sh: %d s in all\n' "$((SECONDS - START))"
[ "${#not_run[@]}" -eq 0 ] || printf 'test.sh: NOT RUN: %s\n' "${not_run[@]}"
if [ -n "$LATEST" ]; then
    echo "test.sh: the canary ran on the newest releases; what differs from the lock:"
    "$BIN/python" scripts/lockcheck.py --report requirements/test.txt | sed 's/^/test.sh:   /'
fi
if [ "${#failed[@]}" -gt 0 ]; then
    echo "test.sh: FAILED: ${failed[*]}"
    exit 1
fi
echo "test.sh: all checks passed"
