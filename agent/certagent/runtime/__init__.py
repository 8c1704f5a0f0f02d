"""The HAProxy side: runtime-API protocol and client, slot pool, loader, haproxy.cfg rendering."""

from certagent.runtime.client import RuntimeClient, probe_identity
from certagent.runtime.protocol import Command, Identity

__all__ = ["Command", "Identity", "RuntimeClient", "probe_identity"]
