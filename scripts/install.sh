#!/usr/bin/env bash
# Install what certagent needs on a Debian 12 or 13 machine, as root; safe to run again.
#
#   - haproxy, redis-server, openssl and pebble (a test ACME CA) from Debian (apt-get update only when
#     something is missing). Package scripts are not allowed to start services:
#     whatever already runs on this machine (a Redis on 6379, another HAProxy)
#     is left alone, and nothing new is started or stopped.
#   - a virtualenv at .venv in the repository root holding exactly the lock
#     requirements/test.txt (runtime + test dependencies, hashes checked; made by
#     scripts/lock.sh) and certagent installed editable; checked against the lock
#     (scripts/lockcheck.py) every run, reinstalled when pyproject.toml or the lock changed.
#   - with --latest (the canary: CERTAGENT_TEST_LATEST=1 bash scripts/test.sh): .venv-latest
#     instead, with the newest releases pyproject.toml allows rather than the lock, upgraded
#     every run; prints which packages differ from the lock.
#   - with --test on Python 3.11: .venv-lowest, the lock requirements/lowest.txt (the lowest
#     versions pyproject.toml admits, and mypy), for scripts/test.sh's second mypy run.
#   - .venv/bin/promtool (tests check the agent's metrics with it): only that file,
#     taken with `apt-get download` + dpkg-deb from Debian's promtool package (Debian 13)
#     or its prometheus package (Debian 12, where promtool is part of it), so no
#     Prometheus service is installed or started; skipped once it is there.
#   - with --test (scripts/test.sh): what only the tests use, from Debian, without
#     recommended packages: debootstrap and patchelf (scripts/haproxy-versions.sh
#     makes Debian's HAProxy 3.0, 3.2 and 3.4 runnable here), testssl.sh, chromium and
#     libnss3-tools (certutil, to make Chromium trust the test CA).
set -euo pipefail

WITH_TEST_TOOLS=""
LATEST=""
for arg in "$@"; do
    case "$arg" in
        --test) WITH_TEST_TOOLS=1 ;;
        --latest) LATEST=1 ;;
        *) printf 'install: unknown option %s (--test, --latest)\n' "$arg" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
[ -z "$LATEST" ] || VENV="$ROOT/.venv-latest"
STAMP="$VENV/.certagent-installed"
LOCK="$ROOT/requirements/test.txt"
LOWEST_LOCK="$ROOT/requirements/lowest.txt"
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

# A virtualenv at $1 (python -m venv; Debian's python3-venv installed when it is missing).
make_venv() {
    [ -x "$1/bin/python" ] && return 0
    say "creating virtualenv $1"
    if ! "$PYTHON" -m venv "$1" >/dev/null 2>&1; then
        rm -rf "$1"
        pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
        say "python3 -m venv failed; installing python3-venv"
        if ! apt_install python3-venv "python$pyver-venv" 2>/dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
            apt_install python3-venv "python$pyver-venv"
        fi
        "$PYTHON" -m venv "$1"
    fi
}

# pip in $1's environment, quietly, its output in $1/pip-install.log (shown when it fails)
venv_pip() {
    local venv="$1" log="$1/pip-install.log"
    shift
    if ! "$venv/bin/python" -m pip --disable-pip-version-check "$@" >>"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "pip $* failed (full log: $log)"
    fi
}

# $1's environment made exactly lock $2 (hashes checked, nothing else left installed);
# with $3 = editable, certagent installed from this checkout too (no dependencies: the
# lock has them; no build isolation: the lock's setuptools builds it, nothing unlocked).
install_locked() {
    local venv="$1" lock="$2" editable="${3:-}" extra
    : >"$venv/pip-install.log"
    venv_pip "$venv" install -q --require-hashes --no-deps -r "$lock"
    # what an earlier lock installed and this one no longer has
    extra="$("$venv/bin/python" "$ROOT/scripts/lockcheck.py" --extra "$lock")"
    if [ -n "$extra" ]; then
        say "removing what $(basename "$lock") no longer pins: $extra"
        # shellcheck disable=SC2086  # one package name per word
        venv_pip "$venv" uninstall -q -y $extra
    fi
    if [ -n "$editable" ]; then
        venv_pip "$venv" install -q --no-deps --no-build-isolation -e "$ROOT"
        # pyproject.toml asks for something the lock does not hold: the lock is stale
        "$venv/bin/python" -m pip check >"$venv/pip-check.log" 2>&1 || {
            cat "$venv/pip-check.log" >&2
            die "$lock does not satisfy pyproject.toml: refresh it with bash scripts/lock.sh"
        }
    fi
    "$venv/bin/python" "$ROOT/scripts/lockcheck.py" "$lock" ||
        die "$venv does not hold exactly $lock (above)"
}

make_venv "$VENV"
if [ -n "$LATEST" ]; then
    # The canary: the newest releases pyproject.toml allows, whatever the lock says.
    say "canary: the newest releases pyproject.toml allows into .venv-latest (not the lock)"
    : >"$VENV/pip-install.log"
    venv_pip "$VENV" install -q --upgrade --upgrade-strategy eager -e "$ROOT[test]"
    "$VENV/bin/python" "$ROOT/scripts/lockcheck.py" --report "$LOCK" | sed 's/^/install: canary: /'
else
    want="$(cat "$ROOT/pyproject.toml" "$LOCK" | sha256sum | cut -d' ' -f1)"
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/certagent" ] &&
        "$VENV/bin/python" "$ROOT/scripts/lockcheck.py" "$LOCK" 2>/dev/null; then
        say "certagent and requirements/test.txt already installed in .venv (nothing changed)"
    else
        say "requirements/test.txt (hashes checked) and certagent (editable) into .venv"
        rm -f "$STAMP"
        install_locked "$VENV" "$LOCK" editable
        printf '%s\n' "$want" >"$STAMP"
    fi
fi
say "ready: $("$VENV/bin/certagent" --version), $("$VENV/bin/python" -V)"

# --- the lowest versions, for a second mypy run (scripts/test.sh) ------------------------
# requirements/lowest.txt is resolved for Python 3.11 (Debian 12): the oldest releases of
# some dependencies have no wheels for newer Pythons.
if [ -n "$WITH_TEST_TOOLS" ] && [ -z "$LATEST" ]; then
    if "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        LOWEST="$ROOT/.venv-lowest"
        want="$(sha256sum <"$LOWEST_LOCK" | cut -d' ' -f1)"
        if [ -f "$LOWEST/.certagent-installed" ] && [ "$(cat "$LOWEST/.certagent-installed")" = "$want" ]; then
            say "requirements/lowest.txt already installed in .venv-lowest"
        else
            say "requirements/lowest.txt (the lowest versions pyproject.toml admits) into .venv-lowest"
            make_venv "$LOWEST"
            rm -f "$LOWEST/.certagent-installed"
            install_locked "$LOWEST" "$LOWEST_LOCK"
            printf '%s\n' "$want" >"$LOWEST/.certagent-installed"
        fi
    else
        say "no .venv-lowest: requirements/lowest.txt is for Python 3.11 (this is $("$PYTHON" -V 2>&1))"
    fi
fi

# --- promtool ------------------------------------------------------------------------
# One static binary out of a Debian package, without installing the package: `apt-get
# download` fetches the .deb and only ./usr/bin/promtool is extracted from it. Debian 13 has
# it in a package of its own (promtool, 8 MB); Debian 12 only inside prometheus (19 MB
# download, 96 MB installed with a web UI and a service we do not want).
PROMTOOL="$VENV/bin/promtool"

# Which package holds promtool here: promtool where the archive has it, else prometheus
# (apt-get update first if apt has no package lists, as in a minimal image).
promtool_package() {
    if ! apt-cache show prometheus >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null || true
    fi
    if apt-cache show promtool >/dev/null 2>&1; then echo promtool; else echo prometheus; fi
}

extract_promtool() {  # $1: an empty work directory, $2: the package; errexit is off in here
    local deb
    (cd "$1" && apt-get download -q "$2" >/dev/null 2>&1) || {
        [ "$(id -u)" -eq 0 ] || { say "apt-get download $2 failed"; return 1; }
        say "apt-get download $2 failed; apt-get update first"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null || return 1
        (cd "$1" && apt-get download -q "$2" >/dev/null) || return 1
    }
    deb="$(find "$1" -maxdepth 1 -name "${2}_*.deb" -print -quit)"
    [ -n "$deb" ] || return 1
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$1" ./usr/bin/promtool || return 1
    "$1/usr/bin/promtool" --version >/dev/null 2>&1 || return 1
    install -m 755 "$1/usr/bin/promtool" "$PROMTOOL.tmp" && mv "$PROMTOOL.tmp" "$PROMTOOL"
}

if [ -x "$PROMTOOL" ]; then
    say "promtool already in .venv/bin"
else
    package="$(promtool_package)"
    say "promtool: extracting usr/bin/promtool from Debian's $package package into .venv/bin"
    work="$(mktemp -d)"
    chmod 755 "$work"  # apt-get download runs as _apt and writes here
    rc=0
    extract_promtool "$work" "$package" || rc=$?
    rm -rf "$work"
    [ "$rc" -eq 0 ] || die "could not get promtool from Debian's $package package (apt-get download $package)"
fi
say "$("$PROMTOOL" --version 2>&1 | head -n 1)"
