"""certagent: lazy-loads TLS certificates into HAProxy through its runtime API."""

__version__ = "0.1.0"
