"""``python -m bench.soak``: a fleet on pebble and Redis, verifying clients, faults (issue 29)."""
