#!/usr/bin/env bash
# Runs HAProxy and certagent side by side in one container (they share unix sockets
# with mode 0600, so they run as the same user). Stops both when either exits.
set -euo pipefail
conf=${CERTAGENT_CONF_DIR:-/etc/certagent}
if [ ! -f "$conf/certagent.toml" ]; then
    certagent init "$conf" --bind "${CERTAGENT_BIND:-0.0.0.0:8443}" \
        --store "${CERTAGENT_STORE:-redis://redis:6379/0}" \
        --capacity "${CERTAGENT_CAPACITY:-1000}" --run-dir "${CERTAGENT_RUN_DIR:-/run/certagent}"
fi
if [ -n "${CERTAGENT_API_TOKEN_NAME:-}" ] && [ ! -f "$conf/tokens" ]; then
    echo "API token (shown once): $(certagent token add "$CERTAGENT_API_TOKEN_NAME" --file "$conf/tokens")"
fi
[ -f "$conf/tokens" ] && export CERTAGENT_API_TOKENS_FILE="$conf/tokens" \
    CERTAGENT_API_BIND="${CERTAGENT_API_BIND:-0.0.0.0:8089}"
haproxy -W -db -f "$conf/haproxy.cfg" &
haproxy_pid=$!
certagent run --config "$conf/certagent.toml" &
agent_pid=$!
trap 'kill -TERM "$haproxy_pid" "$agent_pid" 2>/dev/null' TERM INT
wait -n "$haproxy_pid" "$agent_pid"
kill -TERM "$haproxy_pid" "$agent_pid" 2>/dev/null || true
wait
