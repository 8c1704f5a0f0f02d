#!/usr/bin/env bash
# Runs HAProxy and certagent side by side in one container, as the image's unprivileged user
# (they share unix sockets with mode 0600, so they run as the same user). Stops both when
# either exits. Never prints the API token: it comes from a secret file and only its hash is
# written down.
set -euo pipefail
conf=${CERTAGENT_CONF_DIR:-/etc/certagent}
say() { printf 'certagent-entrypoint: %s\n' "$*"; }
die() { printf 'certagent-entrypoint: error: %s\n' "$*" >&2; exit 1; }

if [ -n "${CERTAGENT_API_TOKEN_FILE:-}" ] && [ ! -r "$CERTAGENT_API_TOKEN_FILE" ]; then
    die "CERTAGENT_API_TOKEN_FILE=$CERTAGENT_API_TOKEN_FILE is missing or not readable by uid" \
        "$(id -u): a Compose secret keeps the owner and mode of its file on the host (make it" \
        "readable: chmod 644, or chown it to uid $(id -u))"
fi

# A fleet shares one data key (CERTAGENT_FLEET_KEY, a path on a volume every node mounts):
# the first node to start makes it, under a lock; every node's init joins with it.
join=()
if [ -n "${CERTAGENT_FLEET_KEY:-}" ]; then
    mkdir -p "$(dirname "$CERTAGENT_FLEET_KEY")"
    (
        flock 9
        if [ ! -s "$CERTAGENT_FLEET_KEY" ]; then
            (umask 077 && certagent keys generate > "$CERTAGENT_FLEET_KEY.tmp")
            mv "$CERTAGENT_FLEET_KEY.tmp" "$CERTAGENT_FLEET_KEY"
        fi
    ) 9>"$CERTAGENT_FLEET_KEY.lock"
    join=(--data-key "$CERTAGENT_FLEET_KEY")
fi
# Certificates on demand (docs/acme.md) when CERTAGENT_ACME_DIRECTORY names a CA: init adds
# fe_http (HTTP-01 answers, on CERTAGENT_HTTP_BIND) and the issuance settings. The permission
# policy comes from the environment too, e.g. CERTAGENT_ACME_ALLOW_SUFFIXES, which the agent
# reads over certagent.toml (as every CERTAGENT_<KEY>).
acme=()
if [ -n "${CERTAGENT_ACME_DIRECTORY:-}" ]; then
    acme=(--acme-directory "$CERTAGENT_ACME_DIRECTORY")
    [ -z "${CERTAGENT_ACME_EMAIL:-}" ] || acme+=(--acme-email "$CERTAGENT_ACME_EMAIL")
    [ -z "${CERTAGENT_ACME_CA_FILE:-}" ] || acme+=(--acme-ca-file "$CERTAGENT_ACME_CA_FILE")
    [ -z "${CERTAGENT_HTTP_BIND:-}" ] || acme+=(--http-bind "$CERTAGENT_HTTP_BIND")
fi
if [ ! -f "$conf/certagent.toml" ]; then
    certagent init "$conf" --bind "${CERTAGENT_BIND:-0.0.0.0:8443}" \
        --store "${CERTAGENT_STORE:-redis://redis:6379/0}" \
        --capacity "${CERTAGENT_CAPACITY:-1000}" --run-dir "${CERTAGENT_RUN_DIR:-/run/certagent}" \
        "${join[@]}" "${acme[@]}"
fi

# The REST API's token: read from a file (a Docker secret, CERTAGENT_API_TOKEN_FILE) and
# registered in $conf/tokens under CERTAGENT_API_TOKEN_NAME as its SHA-256 only; a changed
# secret replaces the old hash at the next start.
tokens="$conf/tokens"
if [ -n "${CERTAGENT_API_TOKEN_FILE:-}" ]; then
    certagent token add "${CERTAGENT_API_TOKEN_NAME:-docker}" --file "$tokens" \
        --from-file "$CERTAGENT_API_TOKEN_FILE" --replace
fi
if [ -f "$tokens" ]; then
    export CERTAGENT_API_TOKENS_FILE="$tokens" CERTAGENT_API_BIND="${CERTAGENT_API_BIND:-0.0.0.0:8089}"
    say "REST API on $CERTAGENT_API_BIND for the tokens named: $(certagent token ls --file "$tokens" | awk '{print $1}' | paste -sd ' ' -)"
else
    say "REST API off: no token (set CERTAGENT_API_TOKEN_FILE to a file holding one, e.g. a secret" \
        "at /run/secrets/api_token; see docker-compose.yml). No token is ever made and printed here."
fi

haproxy -W -db -f "$conf/haproxy.cfg" &
haproxy_pid=$!
certagent run --config "$conf/certagent.toml" &
agent_pid=$!
trap 'kill -TERM "$haproxy_pid" "$agent_pid" 2>/dev/null' TERM INT
wait -n "$haproxy_pid" "$agent_pid"
kill -TERM "$haproxy_pid" "$agent_pid" 2>/dev/null || true
wait
