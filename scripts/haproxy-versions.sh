#!/usr/bin/env bash
# Debian's HAProxy builds, made runnable on this host beside its own (2.6 on Debian 12, 3.0
# on Debian 13), for the version matrix of scripts/test.sh. As root; safe to run again.
#
#   bookworm      HAProxy 2.6 (Debian 12), OpenSSL 3.0: on a Debian 13 host
#   trixie        HAProxy 3.0 (Debian 13), OpenSSL 3.5
#   sid           HAProxy 3.2 (Debian unstable), OpenSSL 3.6
#   experimental  HAProxy 3.4 (Debian experimental's haproxy package on sid's libraries)
#
# For each suite, in $CERTAGENT_HAPROXY_CACHE (default /var/cache/certagent/haproxy, outside
# any checkout, so a clean clone on this machine reuses it):
#   <suite>/root      `debootstrap --variant=minbase --include=haproxy,openssl <suite>`
#                     (experimental: a copy of sid's tree with experimental's haproxy .deb
#                     unpacked over it, fetched with a private apt state; nothing is
#                     installed on the host and nothing runs inside the tree)
#   <suite>/bin/      copies of the tree's haproxy and openssl made to run on the host with
#                     patchelf: the tree's ld.so as interpreter and --force-rpath (DT_RPATH)
#                     to its libraries; a plain --set-rpath (DT_RUNPATH) lets liblua5.4 pick up
#                     the host's libm, which then fails on GLIBC_2.38
#   <suite>/ready     the `haproxy -v` line, written last
# A suite counts as built only if `ready` exists and both binaries still start and report
# that version; anything else (an interrupted run, a deleted library, a package upgraded
# by hand) is removed and rebuilt from scratch (in <suite>.new, renamed to <suite> before the
# binaries are patched to point into it; `ready` is written last).
# One run at a time (flock on the cache directory). About 50 s and 230 MB per suite.
#
# Usage: scripts/haproxy-versions.sh [SUITE...]   (default: trixie sid experimental)
# Prints one line per suite, "<suite> <path of haproxy> <version>", or
# "<suite> unavailable: <why>"; exits 1 if a suite other than experimental is unavailable.
set -euo pipefail

CACHE="${CERTAGENT_HAPROXY_CACHE:-/var/cache/certagent/haproxy}"
MIRROR="${CERTAGENT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
LIBDIR=usr/lib/x86_64-linux-gnu

say() { printf 'haproxy-versions: %s\n' "$*" >&2; }

# `<bin>/haproxy -v` first line, if both binaries of a suite directory run.
probe() {  # $1: suite directory
    local out line
    out="$("$1/bin/haproxy" -v 2>/dev/null)" || return 1
    line="${out%%$'\n'*}"
    [[ "$line" == "HAProxy version "* ]] || return 1
    "$1/bin/haproxy" -vv >/dev/null 2>&1 || return 1  # every library loads (Lua included)
    "$1/bin/openssl" version >/dev/null 2>&1 || return 1
    printf '%s\n' "$line"
}

patch_binaries() {  # $1: suite directory with root/ filled, at its final path
    local dir="$1" root="$1/root" name
    mkdir -p "$dir/bin"
    for name in usr/sbin/haproxy usr/bin/openssl; do
        cp "$root/$name" "$dir/bin/"
        patchelf --set-interpreter "$root/$LIBDIR/ld-linux-x86-64.so.2" \
            --force-rpath --set-rpath "$root/$LIBDIR" "$dir/bin/$(basename "$name")"
    done
}

# Debian experimental's haproxy .deb, downloaded with a private apt state (the host's apt
# lists and settings are not touched), unpacked over a copy of sid's tree.
experimental_tree() {  # $1: the new suite directory
    local dir="$1" sid="$CACHE/sid" apt="$1/apt" deb
    build sid >/dev/null || return 1  # checks sid, rebuilds it if needed
    cp -a "$sid/root" "$dir/root"
    mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$apt/preferences.d"
    printf 'deb [signed-by=%s] %s experimental main\n' \
        "$dir/root/usr/share/keyrings/debian-archive-keyring.gpg" "$MIRROR" >"$apt/sources.list"
    local opts=(
        -o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o "Dir::State=$apt" -o "Dir::State::Lists=$apt/lists"
        -o "Dir::State::status=$dir/root/var/lib/dpkg/status"
        -o "Dir::Cache=$apt" -o "Dir::Cache::archives=$apt/archives"
        -o "Dir::Etc::PreferencesParts=$apt/preferences.d" -o Dir::Etc::Preferences=/nonexistent
        -o APT::Architecture=amd64 -o APT::Sandbox::User=root -q
    )
    apt-get "${opts[@]}" update >"$dir/apt.log" 2>&1 || { say "apt-get update failed: $dir/apt.log"; return 1; }
    (cd "$apt" && apt-get "${opts[@]}" download haproxy/experimental) >>"$dir/apt.log" 2>&1 ||
        { say "experimental has no haproxy to download: $dir/apt.log"; return 1; }
    deb="$(find "$apt" -maxdepth 1 -name 'haproxy_*.deb' -print -quit)"
    [ -n "$deb" ] || return 1
    dpkg-deb -x "$deb" "$dir/root"
    rm -rf "$apt"
}

build() {  # $1: suite; prints "<path> <version line>"
    local suite="$1" dir="$CACHE/$1" line
    if [ -f "$dir/ready" ] && line="$(probe "$dir")" && [ "$line" = "$(cat "$dir/ready")" ]; then
        printf '%s %s\n' "$dir/bin/haproxy" "$line"
        return 0
    fi
    [ -e "$dir" ] && say "$suite: cache at $dir is incomplete or broken; rebuilding it"
    [ "$(id -u)" -eq 0 ] || { say "building $dir needs root (debootstrap)"; return 1; }
    rm -rf "$dir" "$dir.new"
    mkdir -p "$dir.new"
    say "$suite: building $dir (debootstrap, about a minute)"
    if [ "$suite" = experimental ]; then
        experimental_tree "$dir.new" || return 1
    elif ! debootstrap --variant=minbase --include=haproxy,openssl "$suite" "$dir.new/root" \
        "$MIRROR" >"$dir.new/debootstrap.log" 2>&1; then
        say "$suite: debootstrap failed (log: $dir.new/debootstrap.log)"
        return 1
    fi
    # the binaries name their libraries by absolute path: patch them where they stay
    mv "$dir.new" "$dir"
    patch_binaries "$dir"
    line="$(probe "$dir")" || { say "$suite: the patched binaries do not run"; return 1; }
    printf '%s\n' "$line" >"$dir/ready"
    printf '%s %s\n' "$dir/bin/haproxy" "$line"
}

missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v patchelf >/dev/null || missing+=(patchelf)
[ "${#missing[@]}" -eq 0 ] || { say "missing ${missing[*]}: run scripts/install.sh"; exit 1; }

suites=("$@")
[ "${#suites[@]}" -gt 0 ] || suites=(trixie sid experimental)
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
rc=0
for suite in "${suites[@]}"; do
    case "$suite" in bookworm | trixie | sid | experimental) ;; *) say "unknown suite $suite"; exit 2 ;; esac
    if out="$(build "$suite")"; then
        printf '%s %s\n' "$suite" "$out"
    else
        printf '%s unavailable: see the messages above\n' "$suite"
        [ "$suite" = experimental ] || rc=1
    fi
done
exit "$rc"
