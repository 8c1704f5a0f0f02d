#!/usr/bin/env bash
# The Docker checks of scripts/test.sh, with an engine that answers (scripts/test.sh runs this
# under `scripts/docker-engine.sh run`): the compose test (tests/docker/test_compose.py) with
# Compose v1 (docker-compose, Debian 12's 1.29) and v2 (Debian 13's, scripts/docker-engine.sh
# compose-v2), then the untagged images earlier builds of the demo left behind are removed
# (the current images and the build stage's layers stay: the next build's cache).
#
# Usage: scripts/docker-test.sh PYTEST [ARGS...]   (ARGS go to pytest, as test.sh's do)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTEST="$1"
shift
say() { printf 'docker-test: %s\n' "$*"; }

rc=0
v2="$(bash scripts/docker-engine.sh compose-v2)" || {
    say "no Compose v2 (above): the compose test runs with v1 only"
    v2=""
    [ "${CERTAGENT_TEST_DOCKER:-}" != 1 ] || rc=1  # .ci/run: both clients, or a failure
}
printf '== CERTAGENT_DOCKER_STEP=1 CERTAGENT_TEST_COMPOSE_V2=%s pytest -n 0 tests/docker %s\n' "$v2" "$*"
CERTAGENT_DOCKER_STEP=1 CERTAGENT_TEST_COMPOSE_V2="$v2" \
    "$PYTEST" -n 0 --durations=5 tests/docker "$@" || {
    status=$?
    # pytest's 5: the caller's arguments selected no test here (as test.sh's 3.x runs)
    if [ "$status" -eq 5 ] && [ "$#" -gt 0 ]; then
        say "no Docker check matches the arguments given"
    else
        rc=$status
    fi
}
# untagged images of the demo from earlier builds: the final images' now (a tag moved on), the
# build stage's after a week (until then the next build's cache)
docker image prune -f --filter label=org.certagent.demo \
    --filter 'label!=org.certagent.demo=node-build' >/dev/null
docker image prune -f --filter label=org.certagent.demo=node-build --filter until=168h >/dev/null
exit "$rc"
