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


class NotPermitted(AgentError):
    """No permission policy allows the agents to order a certificate for this name."""


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


class BundleTooLarge(CertificateError):
    """The upload is bigger than the configured limit."""

    code = "too-large"


class EncryptedKey(PemError):
    """The private key is protected by a passphrase."""

    code = "encrypted-key"


class MultipleKeys(PemError):
    """More than one private key was given."""

    code = "multiple-keys"


class CaLeaf(CertificateError):
    """The certificate of the key is a CA certificate (basicConstraints CA:TRUE)."""

    code = "ca-certificate"


class OcspError(CertificateError):
    """An OCSP response that cannot be stapled for its certificate."""

    code = "bad-ocsp"


class UnsupportedKey(CertificateError):
    """The key algorithm, curve or key format is not one HAProxy clients can use."""

    code = "unsupported-key"


class WeakKey(CertificateError):
    """The RSA key is shorter than the policy minimum."""

    code = "weak-key"


class Expired(CertificateError):
    """The certificate's notAfter is in the past."""

    code = "expired"


class NotYetValid(CertificateError):
    """The certificate's notBefore is in the future."""

    code = "not-yet-valid"


class ChainTooLong(CertificateError):
    """More certificates than the policy allows."""

    code = "chain-too-long"


class DuplicateCertificate(CertificateError):
    """The same certificate appears twice."""

    code = "duplicate-certificate"


class ChainOrder(CertificateError):
    """The certificates form a valid chain, but not in the order given."""

    code = "chain-order"


class UnrelatedChain(CertificateError):
    """A certificate is not on the leaf's issuer path."""

    code = "unrelated-chain"


# --- store --------------------------------------------------------------------


class StoreError(AgentError):
    """The certificate store failed."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (Redis down, directory missing)."""


class NotFound(StoreError):
    """No record with that id."""


class ChangesLost(StoreError):
    """The change feed no longer holds the position asked for; reconcile everything."""


class InvalidCursor(StoreError):
    """A listing cursor this store did not hand out (a client error: ask from the start)."""


class ReadOnlyRecord(StoreError):
    """The record is managed outside the agent (e.g. by certbot) and cannot be written."""


class StoreCorrupt(StoreError):
    """The store returned a record that does not validate."""


class RotationInProgress(StoreError):
    """Another agent holds the ticket-key rotation lock; its rotation reaches every agent."""


class LeaseLost(StoreError):
    """An issuance lease lapsed and another node took the name: the result is not stored."""


class KeyDecryptError(StoreError):
    """An encrypted private key cannot be decrypted (unknown data key, wrong record, altered)."""


class ForeignDataKey(ConfigError):
    """A writer's data key is not one the fleet's agents hold: they could not read its record.

    ``key_id`` is the writer's current data key, ``fleet`` the key ids every
    agent that announced itself holds (empty if they share none).
    """

    def __init__(self, message: str, key_id: str, fleet: tuple[str, ...]) -> None:
        super().__init__(message)
        self.key_id = key_id
        self.fleet = fleet


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


class StrayTransaction(HAProxyError):
    """HAProxy holds a certificate transaction the agent did not open, or lost mid-commit.

    A commit whose client disappeared (an agent killed by SIGKILL) leaves HAProxy
    2.6.12 with a transaction whose store was freed: any ``abort``, ``set`` or
    ``commit`` on it crashes the worker.  Only a reload clears it safely.
    """

    def __init__(self, name: str) -> None:
        super().__init__(f"HAProxy holds a certificate transaction on {name} that no agent owns")
        self.name = name


class PayloadTooLarge(HAProxyError):
    """The command and payload would not fit HAProxy's ``tune.bufsize``."""


# --- ensure path ------------------------------------------------------------------


class Busy(AgentError):
    """A load could not start before its deadline; the caller should fall back now.

    ``reason`` says which limit was hit (the ensure path counts each, ``/metrics``
    shows them as ``certagent_ensure_busy_total{reason=...}``): ``queue`` (too many
    loads waiting), ``hold`` (the hold ran out: loading, looking up, or waiting for
    the runtime socket), ``slots`` (no slot free in a batch), ``load`` (HAProxy
    refused the load), ``lookups`` (over the store-lookup budget), ``filter`` (the
    name filter not ready yet), ``issuing`` (an ACME issuance still running).
    """

    def __init__(self, message: str, reason: str = "hold") -> None:
        super().__init__(message)
        self.reason = reason
