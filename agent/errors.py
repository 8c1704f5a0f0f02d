"""One exception tree for certagent.

Every failure the agent can report derives from :class:`AgentError`.  Exceptions
from other libraries (redis-py, OSError, cryptography) are translated into this
tree once, at the boundary where they occur, with ``raise ... from exc``.
"""

from __future__ import annotations


class AgentError(Exception):
    """Root of every error certagent raises on purpose."""


class ConfigError(AgentError):
    """The configuration file, an environment variable or a flag is wrong."""


class InvalidHostname(AgentError):
    """A hostname (SNI, store key, certificate name) failed validation."""


# --- certificates -------------------------------------------------------------


class CertificateError(AgentError):
    """A certificate bundle is unusable.  ``code`` is a stable machine-readable reason."""

    code = "invalid-certificate"


class PemError(CertificateError):
    code = "bad-pem"


class MissingKey(CertificateError):
    code = "missing-key"


class KeyMismatch(CertificateError):
    code = "key-mismatch"


class NoNames(CertificateError):
    code = "no-names"


# --- store --------------------------------------------------------------------


class StoreError(AgentError):
    """The certificate store failed."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (Redis down, directory missing)."""


class StoreCorrupt(StoreError):
    """The store returned a record that does not validate."""


# --- HAProxy runtime API --------------------------------------------------------


class HAProxyError(AgentError):
    """Talking to HAProxy's runtime API failed."""


class HAProxyUnavailable(HAProxyError):
    """The runtime socket cannot be reached or closed on us."""


class HAProxyTimeout(HAProxyError):
    """HAProxy did not answer in time."""


class CommandFailed(HAProxyError):
    """HAProxy answered a command with an error."""

    def __init__(self, command: str, reply: str) -> None:
        super().__init__(f"HAProxy refused {command!r}: {reply.strip()[:300]}")
        self.command = command
        self.reply = reply


class Locked(CommandFailed):
    """``Operations on certificates are currently locked!`` — retry later."""


class WrongTransaction(HAProxyError):
    """HAProxy answered for a certificate we did not send (2.6.12 transaction merge)."""


class PayloadTooLarge(HAProxyError):
    """The command and payload would not fit HAProxy's ``tune.bufsize``."""


# --- ensure path ------------------------------------------------------------------


class Busy(AgentError):
    """A load could not start before its deadline; the caller should fall back now."""
