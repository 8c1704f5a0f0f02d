#!/usr/bin/env bash
# The demo: install, then run demo/run.py (arguments pass through, e.g. --keep).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install.sh
exec "$ROOT/.venv/bin/python" -m demo "$@"
