"""systemd's readiness protocol (sd_notify), without a library: one datagram per state.

Under ``Type=notify`` systemd sets ``NOTIFY_SOCKET``; the agent sends
``READY=1`` once its socket answers the Lua action, ``RELOADING=1`` and
``READY=1`` around a SIGHUP, ``STOPPING=1`` when it stops, and ``STATUS=`` lines
that ``systemctl status`` shows.  Outside systemd every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(*states: str) -> bool:
    """Send ``states`` (e.g. ``"READY=1"``) to systemd; False if not under systemd."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall("\n".join(states).encode())
    except OSError as exc:
        log.warning("cannot tell systemd %s: %s", " ".join(states), exc)
        return False
    return True
