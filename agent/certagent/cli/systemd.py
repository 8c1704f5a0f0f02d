"""Unit files for ``certagent init --systemd``: the agent, a drop-in for haproxy.service, tmpfiles.

The agent runs as HAProxy's user (they share unix sockets of mode 0600),
``Type=notify`` (it says READY once its socket answers), ordered after
haproxy.service, reloaded with SIGHUP, and hardened.  Debian's haproxy.service
is pointed at the generated haproxy.cfg by a drop-in, which also gives the
agent HAProxy's master CLI (``-S``) so that it can ask for a reload although the
master runs as root.  ``systemd-analyze verify`` checks them in the tests.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SystemdPlan:
    directory: Path  # the init directory (certagent.toml, haproxy.cfg)
    run_dir: Path
    user: str
    master_socket: str
    writable: tuple[Path, ...] = ()  # besides the run directory: a directory store

def certagent_command() -> str:
    """The absolute path of the ``certagent`` command running now (its venv's)."""
    beside = Path(sys.executable).with_name("certagent")
    if beside.exists():
        return str(beside)
    found = shutil.which("certagent")
    return found or "/usr/local/bin/certagent"


def systemd_files(plan: SystemdPlan) -> dict[str, str]:
    """Relative path (under the init directory) -> contents."""
    config = plan.directory / "certagent.toml"
    return {
        "systemd/certagent.service": f"""\
# certagent, next to HAProxy. Install: copy to /etc/systemd/system/, then
#   systemctl daemon-reload && systemctl enable --now certagent
[Unit]
Description=certagent: lazy-loads TLS certificates into HAProxy
After=network-online.target haproxy.service redis-server.service
Wants=network-online.target haproxy.service

[Service]
Type=notify
NotifyAccess=main
User={plan.user}
Group={plan.user}
ExecStart={certagent_command()} run --config {config}
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=1s
TimeoutStopSec=15s
UMask=0077
# hardening: the agent reads its config, writes only its sockets (and a directory store),
# and talks over unix sockets and TCP (Redis, its REST API)
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths={" ".join(str(p) for p in (plan.run_dir, *plan.writable))}
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
CapabilityBoundingSet=
AmbientCapabilities=

[Install]
WantedBy=multi-user.target
""",
        "systemd/haproxy.service.d/certagent.conf": f"""\
# Debian's haproxy.service, pointed at certagent's haproxy.cfg. Install: copy this directory
# to /etc/systemd/system/haproxy.service.d/, then systemctl daemon-reload.
# -S gives the agent ({plan.user}) HAProxy's master CLI: the master runs as root, and the
# agent asks it for a reload in the one case that needs one (docs/haproxy.md).
[Service]
Environment="CONFIG={plan.directory / "haproxy.cfg"}"
Environment="EXTRAOPTS=-S {plan.master_socket},mode,600,user,{plan.user}"
""",
        "systemd/certagent.tmpfiles.conf": f"""\
# The unix sockets' directory, made at boot before HAProxy starts. Install: copy to
# /etc/tmpfiles.d/certagent.conf, then systemd-tmpfiles --create
d {plan.run_dir} 0700 {plan.user} {plan.user} -
""",
    }
