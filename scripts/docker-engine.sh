#!/usr/bin/env bash
# A Docker engine for the Docker checks (scripts/test.sh's compose step, .ci/run's Debian 13
# job), shared safely by every run on the machine. As root to install or start one.
#
#   scripts/docker-engine.sh install       docker.io and docker-compose from Debian (Docker
#                                          20.10 and docker-compose 1.29 on Debian 12) when
#                                          dockerd or docker-compose is missing
#   scripts/docker-engine.sh compose-v2   prints the path of Compose v2 (Debian 13's
#                                          docker-compose 2.x, the plugin's binary, which also
#                                          runs on its own), taken out of its package with
#                                          `apt-get download` in a debian:13-slim container and
#                                          kept in $CERTAGENT_COMPOSE_V2_CACHE (default
#                                          /var/cache/certagent/compose-v2); needs an engine
#   scripts/docker-engine.sh run CMD...    CMD with an engine: the one that answers already
#                                          (started by anyone), or one started here if none
#                                          does (`dockerd`, no init system needed); exits with
#                                          CMD's status, or 75 without running CMD when no
#                                          engine can be had (the reason on stderr)
#
# An engine started here is stopped by its PID by the last `run` that uses it: every run holds
# a shared lock on $STATE/users while its CMD runs; at the end a run that can take that lock
# alone stops the daemon recorded in $STATE/dockerd.pid (one started by this script, never
# one it did not start). Deciding to start or to stop happens under $STATE/start, one run at
# a time. Concurrent runs from several checkouts therefore share one daemon, and none stops
# it under another's feet. Images, layers and the base image stay in the
# engine's /var/lib/docker from one run to the next: the cache of every later build.
set -euo pipefail

STATE="${CERTAGENT_DOCKER_STATE:-/run/certagent-docker}"
NO_ENGINE=75
START_TIMEOUT=60

say() { printf 'docker-engine: %s\n' "$*" >&2; }

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

install_engine() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v docker-compose >/dev/null || missing+=(docker-compose)
    if [ "${#missing[@]}" -eq 0 ]; then
        say "dockerd and docker-compose are installed"
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || { say "installing ${missing[*]} needs root (apt-get)"; return 1; }
    say "installing ${missing[*]} from Debian (apt-get update first)"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    # policy-rc.d: the packages' scripts must not start a service (see scripts/install.sh)
    local policy=/usr/sbin/policy-rc.d ours=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && ours=1
    fi
    local rc=0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}" >/dev/null || rc=$?
    [ -z "$ours" ] || rm -f "$policy"
    return "$rc"
}

# The daemon recorded in dockerd.pid, if that process is still a dockerd.
our_daemon() {
    local pid
    pid="$(cat "$STATE/dockerd.pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] || return 1
    printf '%s\n' "$pid"
}

# Under the start lock (fd 8): use the engine that answers, or start one.
acquire() {
    if engine_answers; then
        if pid="$(our_daemon)"; then
            say "using the engine started for these checks (dockerd pid $pid)"
        else
            say "using the running engine ($(docker version -f '{{.Server.Version}}' 2>/dev/null || echo '?'))"
        fi
        return 0
    fi
    command -v dockerd >/dev/null || {
        say "no Docker engine: none answers and dockerd is not installed" \
            "(scripts/docker-engine.sh install, as root)"
        return 1
    }
    [ "$(id -u)" -eq 0 ] || { say "no Docker engine: none answers, and starting dockerd needs root"; return 1; }
    # in its own session (a Ctrl-C of this run must not stop an engine other runs may share;
    # the next run's end stops it), and without the lock descriptors: it must not hold the
    # locks that say who uses it
    setsid dockerd >"$STATE/dockerd.log" 2>&1 8>&- 9>&- </dev/null &
    local pid=$! waited=0
    printf '%s\n' "$pid" >"$STATE/dockerd.pid"
    until engine_answers; do
        if ! kill -0 "$pid" 2>/dev/null || [ "$waited" -ge "$START_TIMEOUT" ]; then
            say "dockerd (pid $pid) did not answer within ${waited} s; its log:"
            tail -n 20 "$STATE/dockerd.log" >&2
            stop_daemon "$pid"
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    say "started dockerd (pid $pid, $(docker version -f '{{.Server.Version}}'), log $STATE/dockerd.log) in ${waited} s"
}

stop_daemon() {  # $1: the pid of a dockerd this script started
    local pid="$1" i
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 60; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "dockerd pid $pid still runs 30 s after SIGTERM: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/dockerd.pid"
}

run_with_engine() {
    mkdir -p "$STATE"
    exec 8>>"$STATE/start" 9>>"$STATE/users"
    flock -x 8
    flock -s 9  # one of the runs using the engine, before looking at it
    if ! acquire; then
        flock -u 9
        flock -u 8
        return "$NO_ENGINE"
    fi
    flock -u 8
    local rc=0
    "$@" 8>&- 9>&- || rc=$?
    # the last run out stops a daemon started here; while a run still uses it, it stays
    flock -x 8
    if flock -x -n 9 && pid="$(our_daemon)"; then
        say "stopping dockerd pid $pid (started for these checks; no other run uses it)"
        stop_daemon "$pid"
    fi
    flock -u 9
    flock -u 8
    return "$rc"
}

# Debian 13's Compose v2 binary, cached outside any checkout; prints its path.
compose_v2() {
    local cache="${CERTAGENT_COMPOSE_V2_CACHE:-/var/cache/certagent/compose-v2}"
    local bin="$cache/docker-compose"
    if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
        printf '%s\n' "$bin"
        return 0
    fi
    engine_answers || { say "compose-v2: no Docker engine answers"; return 1; }
    bash "$(dirname "${BASH_SOURCE[0]}")/docker-base.sh" >&2 || return 1
    mkdir -p "$cache"
    say "compose-v2: taking Debian 13's docker-compose out of its package (apt-get download)"
    docker run --rm --network bridge debian:13-slim bash -c '
        set -e
        apt-get update -q >/dev/null
        cd /tmp && apt-get download -q docker-compose >/dev/null
        dpkg-deb --fsys-tarfile docker-compose_*.deb |
            tar -xO ./usr/libexec/docker/cli-plugins/docker-compose' >"$bin.tmp" || {
        rm -f "$bin.tmp"
        say "compose-v2: could not get docker-compose from Debian 13"
        return 1
    }
    chmod 755 "$bin.tmp" && mv "$bin.tmp" "$bin"
    say "compose-v2: $("$bin" version)"
    printf '%s\n' "$bin"
}

case "${1:-}" in
    install) install_engine ;;
    compose-v2) compose_v2 ;;
    run)
        shift
        [ "$#" -gt 0 ] || { say "run: give a command"; exit 2; }
        rc=0
        run_with_engine "$@" || rc=$?
        exit "$rc"
        ;;
    -h | --help | "") awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}" ;;
    *) say "unknown command $1 (install, compose-v2, run CMD...)"; exit 2 ;;
esac
