"""The HAProxy side: runtime-API protocol and client, slot pool, loader, haproxy.cfg rendering."""

from certagent.runtime.client import Command, Identity, RuntimeClient, probe_identity

__all__ = ["Command", "Identity", "RuntimeClient", "probe_identity"]
