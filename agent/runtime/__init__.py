"""HAProxy runtime API: sans-IO protocol and the single-writer async client."""

from agent.runtime.client import Identity, RuntimeClient, probe_identity

__all__ = ["Identity", "RuntimeClient", "probe_identity"]
