#!/usr/bin/env bash
# Install what certagent needs on a Debian 12 machine, as root; safe to run again.
#
#   - haproxy, redis-server, openssl and pebble (a test ACME CA) from Debian (apt-get update only when
#     something is missing). Package scripts are not allowed to start services:
#     whatever already runs on this machine (a Redis on 6379, another HAProxy)
#     is left alone, and nothing new is started or stopped.
#   - a virtualenv at .venv in the repository root with certagent installed
#     editable with its test extras; skipped while pyproject.toml is unchanged.
#   - .venv/bin/promtool (tests check the agent's metrics with it): only that file,
#     taken from Debian's prometheus package with `apt-get download` + dpkg-deb,
#     so no Prometheus service is installed or started; skipped once it is there.
#   - with --test (scripts/test.sh): what only the tests use, from Debian, without
#     recommended packages: debootstrap and patchelf (scripts/haproxy-versions.sh
#     makes Debian's HAProxy 3.0, 3.2 and 3.4 runnable here), testssl.sh, chromium and
#     libnss3-tools (certutil, to make Chromium trust the test CA).
set -euo pipefail

WITH_TEST_TOOLS=""
for arg in "$@"; do
    case "$arg" in
        --test) WITH_TEST_TOOLS=1 ;;
        *) printf 'install: unknown option %s (only --test)\n' "$arg" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.certagent-installed"
# gcc, libc6-dev and libssl-dev build the benchmark's C load generator (bench/tlsload.c);
# systemd brings systemd-analyze, which checks the unit `certagent init --systemd` writes
# (tests/integration/test_init.py; a minimal Debian image has no systemd).
# pebble brings pebble + pebble-challtestsrv, the test ACME CA the ACME tests start on
# loopback high ports (certagent/testing/pebble.py); the package starts no service.
PACKAGES=(haproxy redis-server openssl gcc libc6-dev libssl-dev systemd pebble)
TEST_PACKAGES=(debootstrap patchelf testssl.sh chromium libnss3-tools)

say() { printf 'install: %s\n' "$*"; }
die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# Install Debian packages without letting their maintainer scripts start (or
# restart) any service: invoke-rc.d and deb-systemd-invoke both obey
# /usr/sbin/policy-rc.d, and exit code 101 means "action forbidden".
apt_install() {
    [ "$(id -u)" -eq 0 ] || die "installing $* needs root (apt-get)"
    local policy=/usr/sbin/policy-rc.d ours=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# written by certagent scripts/install.sh while apt-get runs\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        ours=1
        # shellcheck disable=SC2064  # expand now: remove exactly the file we wrote
        trap "rm -f '$policy'" EXIT
    fi
    local rc=0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Options::=--force-confold \
        "$@" >/dev/null || rc=$?
    if [ -n "$ours" ]; then
        rm -f "$policy"
        trap - EXIT
    fi
    return "$rc"
}

# --- Debian packages -----------------------------------------------------------------
PYTHON="${PYTHON:-python3}"
missing=()
for pkg in "${PACKAGES[@]}"; do
    installed "$pkg" || missing+=("$pkg")
done
# A minimal Debian image has no Python at all.
command -v "$PYTHON" >/dev/null || missing+=(python3 python3-venv)
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]} (apt-get update first)"
    [ "$(id -u)" -eq 0 ] || die "installing ${missing[*]} needs root (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    apt_install "${missing[@]}"
else
    say "${PACKAGES[*]}: already installed"
fi
if [ -n "$WITH_TEST_TOOLS" ]; then
    missing=()
    for pkg in "${TEST_PACKAGES[@]}"; do
        installed "$pkg" || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        say "installing the test tools ${missing[*]} (apt-get update first)"
        [ "$(id -u)" -eq 0 ] || die "installing ${missing[*]} needs root (apt-get)"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
        apt_install --no-install-recommends "${missing[@]}"
    else
        say "${TEST_PACKAGES[*]}: already installed"
    fi
fi
say "$(haproxy -v 2>/dev/null | head -n 1 | cut -d' ' -f1-3), $(redis-server --version | cut -d' ' -f1-3)"

# --- Python --------------------------------------------------------------------------
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (Debian 12 ships python3 3.11)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "certagent needs Python >= 3.11, $PYTHON is $("$PYTHON" -V 2>&1)"

if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    if ! "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; then
        rm -rf "$VENV"
        pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
        say "python3 -m venv failed; installing python3-venv"
        if ! apt_install python3-venv "python$pyver-venv" 2>/dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
            apt_install python3-venv "python$pyver-venv"
        fi
        "$PYTHON" -m venv "$VENV"
    fi
fi

want="$(sha256sum <"$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/certagent" ]; then
    say "certagent already installed in .venv (pyproject.toml unchanged)"
else
    say "pip install -e '.[test]' into .venv"
    log="$VENV/pip-install.log"
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]" \
        >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "pip install failed (full log: $log)"
    fi
    printf '%s\n' "$want" >"$STAMP"
fi
say "ready: $("$VENV/bin/certagent" --version), $("$VENV/bin/python" -V)"

# --- promtool ------------------------------------------------------------------------
# One static binary out of Debian's prometheus package (19 MB download, 96 MB installed with
# a web UI and a service we do not want): `apt-get download` fetches the .deb without
# installing it, and only ./usr/bin/promtool is extracted from it.
PROMTOOL="$VENV/bin/promtool"

extract_promtool() {  # $1: an empty work directory; errexit is off in here (called with ||)
    local deb
    (cd "$1" && apt-get download -q prometheus >/dev/null 2>&1) || {
        [ "$(id -u)" -eq 0 ] || { say "apt-get download prometheus failed"; return 1; }
        say "apt-get download prometheus failed; apt-get update first"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null || return 1
        (cd "$1" && apt-get download -q prometheus >/dev/null) || return 1
    }
    deb="$(find "$1" -maxdepth 1 -name 'prometheus_*.deb' -print -quit)"
    [ -n "$deb" ] || return 1
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$1" ./usr/bin/promtool || return 1
    "$1/usr/bin/promtool" --version >/dev/null 2>&1 || return 1
    install -m 755 "$1/usr/bin/promtool" "$PROMTOOL.tmp" && mv "$PROMTOOL.tmp" "$PROMTOOL"
}

if [ -x "$PROMTOOL" ]; then
    say "promtool already in .venv/bin"
else
    say "promtool: extracting usr/bin/promtool from Debian's prometheus package into .venv/bin"
    work="$(mktemp -d)"
    chmod 755 "$work"  # apt-get download runs as _apt and writes here
    rc=0
    extract_promtool "$work" || rc=$?
    rm -rf "$work"
    [ "$rc" -eq 0 ] || die "could not get promtool from Debian's prometheus package (apt-get download prometheus)"
fi
say "$("$PROMTOOL" --version 2>&1 | head -n 1)"
