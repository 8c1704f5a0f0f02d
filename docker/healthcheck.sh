#!/bin/sh
# The image's HEALTHCHECK: exit 0 when the agent's /readyz answers 200 (HAProxy and the store are
# usable). The REST API listens only when there is a tokens file; without one, `certagent check`.
set -eu
conf=${CERTAGENT_CONF_DIR:-/etc/certagent}
if [ -f "$conf/tokens" ]; then
    bind=${CERTAGENT_API_BIND:-0.0.0.0:8089}
    exec python3 -c '
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=5)
except OSError as exc:
    sys.exit(f"/readyz: {exc}")
' "${bind##*:}"
fi
exec certagent check --config "$conf/certagent.toml"
