#!/usr/bin/env bash
# The Debian 13 job (.ci/run): the README's two commands on a fresh Debian 13, in a
# debian:13-slim container (scripts/docker-base.sh) with host networking, as root:
#
#   bash scripts/demo.sh                                 the demo, whole: it must pass
#   CERTAGENT_TEST_VERSIONS=3.0 CERTAGENT_TEST_DOCKER=0 bash scripts/test.sh tests/unit
#                                                        the test command on Debian 13's own
#                                                        HAProxy 3.0 and Python 3.13: install
#                                                        (--test), ruff, mypy, the import
#                                                        layers and the unit tests
#
# The checkout goes in as its files (`git ls-files`: tracked, and new files git does not
# ignore; no virtualenv, cache or demo-run/ of this machine). Downloads are cached across runs
# in $CERTAGENT_DEBIAN13_CACHE (default /var/cache/certagent/debian13), what a CI cache would
# hold: apt's .deb files (290 MB), and pip's cache where the index's answers may be cached
# (here they may not: the wheels are downloaded each run). Every package is still installed
# fresh in the fresh container, its hash checked. 240 s on a cold machine, 170 s warm (load
# 7-8 on 2 CPUs). Needs a Docker engine (scripts/docker-engine.sh run).
#
# Usage: scripts/debian13.sh [--demo-only | --tests-only]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${CERTAGENT_DEBIAN13_CACHE:-/var/cache/certagent/debian13}"
IMAGE=debian:13-slim
say() { printf 'debian13: %s\n' "$*" >&2; }

run_demo=1 run_tests=1
case "${1:-}" in
    "") ;;
    --demo-only) run_tests="" ;;
    --tests-only) run_demo="" ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) say "unknown option $1 (--demo-only, --tests-only)"; exit 2 ;;
esac

bash "$ROOT/scripts/docker-base.sh"
mkdir -p "$CACHE/apt" "$CACHE/pip"

# What runs inside: each command timed, the first failure ends the job with its status.
inner='
set -euo pipefail
rm -f /etc/apt/apt.conf.d/docker-clean  # keep the downloaded .deb files: the cache volume
mkdir /w && tar -x -C /w && cd /w
timed() {
    local began=$SECONDS rc=0
    printf "\n== debian13: %s\n" "$*"
    "$@" || rc=$?
    printf "== debian13: %s: exit %d after %d s\n" "$*" "$rc" "$((SECONDS - began))"
    return "$rc"
}
. /etc/os-release && echo "== debian13: $PRETTY_NAME"
[ -z "$RUN_DEMO" ] || timed bash scripts/demo.sh
# no Docker engine in here: the Docker checks run outside, in .ci/run
[ -z "$RUN_TESTS" ] || timed env CERTAGENT_TEST_VERSIONS=3.0 CERTAGENT_TEST_DOCKER=0 \
    bash scripts/test.sh tests/unit
'

started=$SECONDS
rc=0
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
    tar --null -T - -c --ignore-failed-read) |
    docker run --rm -i --network host \
        -e RUN_DEMO="$run_demo" -e RUN_TESTS="$run_tests" \
        -v "$CACHE/apt:/var/cache/apt/archives" -v "$CACHE/pip:/root/.cache/pip" \
        "$IMAGE" bash -c "$inner" || rc=$?
say "$( [ "$rc" -eq 0 ] && echo passed || echo "FAILED (exit $rc)" ) in $((SECONDS - started)) s"
exit "$rc"
