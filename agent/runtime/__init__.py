"""HAProxy runtime API: sans-IO protocol and the single-writer async client."""

from agent.runtime.client import Command, Identity, RuntimeClient, probe_identity

__all__ = ["Command", "Identity", "RuntimeClient", "probe_identity"]
