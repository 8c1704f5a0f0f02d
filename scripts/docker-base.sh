#!/usr/bin/env bash
# The one base image every certagent image builds on (Dockerfile, docker/*.Dockerfile):
# debian:13-slim. Safe to run again; as root when it has to make the image.
#
#   1. already in the engine (pulled or made before): nothing to do;
#   2. otherwise `docker pull debian:13-slim` from the registry the engine is set up with;
#   3. otherwise (no registry reachable) made here: `debootstrap --variant=minbase trixie`
#      from the Debian mirror this machine's apt already uses (read from `apt-cache policy`
#      at run time, or CERTAGENT_DEBIAN_MIRROR), laid out as the official slim image is (the
#      same apt sources, no documentation or man pages installed), plus this machine's own
#      trust anchors from /usr/local/share/ca-certificates: a build behind a TLS-inspecting
#      proxy needs its CA, and the images' `apt-get install ca-certificates` takes them in.
#      Then `docker import`. About a minute; cached in the engine from then on.
#
# The Dockerfiles are the same either way: a made image stands in for the pulled one.
#
#   scripts/docker-base.sh            debian:13-slim
#   scripts/docker-base.sh --refresh  make it again even if the engine has one (a made image
#                                     does not follow Debian's updates by itself; a pulled
#                                     one is pulled again)
set -euo pipefail

IMAGE=debian:13-slim
SUITE=trixie
REFRESH=""
for arg in "$@"; do
    case "$arg" in
        --refresh) REFRESH=1 ;;
        -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) printf 'docker-base: unknown option %s (--refresh)\n' "$arg" >&2; exit 2 ;;
    esac
done

say() { printf 'docker-base: %s\n' "$*" >&2; }
die() { printf 'docker-base: error: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info); start one first"

if [ -z "$REFRESH" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    made="$(docker image inspect -f '{{index .Config.Labels "org.certagent.base"}}' "$IMAGE")"
    say "$IMAGE is in the engine already${made:+ (made here: $made)}"
    exit 0
fi

if timeout 120 docker pull -q "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE pulled from the registry"
    exit 0
fi
say "$IMAGE cannot be pulled (no registry reachable?): making it with debootstrap"

# The Debian archive and its security archive as this machine's apt sees them: the URI of
# the first source that serves <codename>/main (and <codename>-security/main).
host_source() {  # $1: suite suffix ("" or "-security")
    local codename
    codename="$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")"
    [ -n "$codename" ] || return 0
    apt-cache policy 2>/dev/null |
        awk -v want="$codename$1/main" '$1 ~ /^[0-9]+$/ && $3 == want { print $2; exit }'
}
MIRROR="${CERTAGENT_DEBIAN_MIRROR:-$(host_source "")}"
SECURITY="${CERTAGENT_DEBIAN_SECURITY_MIRROR:-$(host_source -security)}"
[ -n "$MIRROR" ] || die "no Debian mirror found in this machine's apt sources: set" \
    "CERTAGENT_DEBIAN_MIRROR (e.g. the URI of a Debian archive) and run again"
[ "$(id -u)" -eq 0 ] || die "making $IMAGE needs root (debootstrap)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"

work="$(mktemp -d /var/tmp/certagent-base.XXXXXX)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
started=$SECONDS
say "debootstrap --variant=minbase $SUITE from $MIRROR (about a minute)"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
    tail -n 20 "$work/debootstrap.log" >&2
    die "debootstrap $SUITE failed (above)"
}

# apt sources as in the official image (deb822), on this machine's mirrors
{
    printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' "$MIRROR" "$SUITE" "$SUITE"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    if [ -n "$SECURITY" ]; then
        printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' "$SECURITY" "$SUITE"
        printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    fi
} >"$root/etc/apt/sources.list.d/debian.sources"
rm -f "$root/etc/apt/sources.list"

# slim: what the official image keeps out of every package it installs
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# as in the official debian:*-slim images: no documentation, man pages or translations
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
# as in the official images: no .deb kept after installing it
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
rm -rf "$root/usr/share/man/"* "$root/usr/share/info/"* "$root/usr/share/locale/"*
rm -rf "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin "$root/var/cache/apt/archives/"*.deb
rm -f "$root/var/log/"*.log "$root/var/log/apt/"*

# this machine's extra trust anchors (taken in by `update-ca-certificates` in the images)
anchors=0
mkdir -p "$root/usr/local/share/ca-certificates"
for crt in /usr/local/share/ca-certificates/*.crt; do
    [ -f "$crt" ] || continue
    cp "$crt" "$root/usr/local/share/ca-certificates/"
    anchors=$((anchors + 1))
done

label="debootstrap $SUITE $(date -u +%Y-%m-%dT%H:%MZ), $anchors local trust anchors"
tar --numeric-owner -C "$root" -c . |
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' \
        --change "LABEL org.certagent.base=\"$label\"" \
        - "$IMAGE" >/dev/null
say "$IMAGE made in $((SECONDS - started)) s ($label): $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}')"
