"""Settings: a TOML file, overridden key by key by ``CERTAGENT_<KEY>`` environment variables.

Loaded once into a frozen :class:`Settings`; every key is documented in
``docs/configuration.md``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from certagent.errors import ConfigError

FALLBACKS = ("default-cert", "reject")


class DualCerts(StrEnum):
    """Which certificates of a name with both an ECDSA and an RSA one are loaded.

    HAProxy 2.6.12's choice between the two, per client, is in docs/haproxy.md.
    """

    BOTH = "both"  # every kind found; HAProxy chooses per client
    ECDSA = "ecdsa"  # only the ECDSA one (a name with only RSA still gets it)
    RSA = "rsa"  # only the RSA one (a name with only ECDSA still gets it)


DIR_WATCH_MODES = ("auto", "poll")
ACME_KEY_TYPES = ("ecdsa", "rsa", "both")
ACME_CHALLENGES = ("http-01", "tls-alpn-01")
#: seconds of hold left after acme_wait, for loading the issued certificate
ACME_LOAD_MARGIN = 1.0
# ticketkeys.MIN_INTERVAL, without importing the certificate layer here
MIN_TICKET_ROTATION = 600.0
# HAProxy's inspect-delay bounds how long a connection can wait; init renders it from hold.
MAX_HOLD = 60.0
# The default Alt-Svc max-age of `certagent init --http3` (s): docs/haproxy.md#http3.
HTTP3_MAX_AGE = 3600
# Keys older versions wrote, and what to do about each.
RETIRED = {
    "map_file": "loaded hosts are marked in the usage table now; delete the line and re-run"
    " 'certagent init' to regenerate haproxy.cfg",
    "load_deadline": "renamed hold (how long a new host's connection may wait, default 5 s)",
    "watch_interval": "reloads are noticed from the Lua action's requests; delete the line",
    "usage_refresh": "slots to recycle are sampled (victim_samples); delete the line",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    # where certificates come from: redis://host:port/db, or file:///dir (or a plain path)
    store: str = "file:///var/lib/certagent/certs"
    # a file whose first line is the store's password (mode 0600), kept out of `store`
    store_password_file: str = ""
    # a file whose first line is the sentinels' own password (redis+sentinel:// only, when
    # it is not the data nodes' one: that is ?sentinel_auth=yes in `store`)
    store_sentinel_password_file: str = ""
    # Redis key prefix (Redis store only)
    redis_prefix: str = "certagent:"
    # HAProxy runtime socket (stats socket ... level admin)
    haproxy_socket: str = "/run/certagent/admin.sock"
    # HAProxy's master CLI (haproxy -S PATH): the agent asks it to reload in the rare case
    # that needs one; "" = SIGUSR2 to the worker's parent (same user)
    haproxy_master_socket: str = ""
    # the agent's own unix socket, asked by the Lua action and by `certagent status`
    agent_socket: str = "/run/certagent/agent.sock"
    # the crt-list exactly as written in haproxy.cfg
    crt_list: str = "/etc/certagent/certagent.crtlist"
    # stick-table marking loaded hosts (gpt0 = slot) and their usage: the public frontend's
    # name, and the table's expire in ms
    usage_table: str = "fe_sni"
    usage_expire_ms: int = 3_600_000
    # slots drawn at random when choosing one to recycle (more: closer to exact LRU)
    victim_samples: int = 8
    # at most this many certificates held in HAProxy
    capacity: int = 1000
    # name prefix of the agent's certificate slots inside HAProxy
    slot_prefix: str = "/certagent/slot-"
    # names absent from the store are not looked up again for this long (s), at most this many
    negative_ttl: float = 30.0
    negative_cache_size: int = 100_000
    # a new host's connection waits at most this long for its certificate (s), then "busy"
    hold: float = 5.0
    # at most this many loads waiting for the writer; more answer "busy" at once
    max_waiting_loads: int = 10_000
    # at most this many queued loads are sent to HAProxy in one pipelined batch
    load_batch: int = 4
    # after an HAProxy reload, re-load at most this many hosts, most recently used first
    rewarm_max: int = 10_000
    # a name with both an ECDSA and an RSA certificate: load both, or only one kind
    dual_certs: DualCerts = DualCerts.BOTH
    # store lookups per second at most, on average (twice that at once); more answer "busy"
    lookup_rate: float = 1000.0
    # hosts marked loaded under one wildcard certificate at most (random-subdomain floods)
    wildcard_hosts: int = 10_000
    # HAProxy's tune.bufsize: command + PEM must fit
    haproxy_bufsize: int = 16384
    # runtime-API reply timeout (s)
    haproxy_timeout: float = 5.0
    # what clients get when no certificate can be loaded (used by `certagent init`)
    fallback: str = "default-cert"
    # haproxy.cfg serves HTTP/3 (`certagent init --http3`): the agent refuses an HAProxy
    # built without QUIC and reports fe_tls's QUIC handshake failures
    http3: bool = False
    # the Alt-Svc max-age (s) `certagent init --http3` writes into haproxy.cfg: how long a
    # client keeps trying HTTP/3 first (docs/haproxy.md#http3 says how it was chosen)
    http3_max_age: int = HTTP3_MAX_AGE
    log_level: str = "info"
    # "text" or "json" (one object per line: time, level, logger, message)
    log_format: str = "text"
    # REST API listen address, host:port ([::1]:8089 for IPv6); served only with api_tokens_file
    api_bind: str = "127.0.0.1:8089"
    # GET /metrics (Prometheus) on an address of its own, no token; "" = only on the REST
    # API's listener (when it runs)
    metrics_bind: str = ""
    # fetch OCSP responses from each loaded certificate's own responder (AIA), when due
    ocsp_fetch: bool = True
    # a stored certificate whose notAfter is this close (days) is warned about, once
    expiry_warning_days: float = 21.0
    # REST API bearer tokens, "name:sha256hex" lines (`certagent token add`); "" = no REST API
    api_tokens_file: str = ""
    # serve the REST API over TLS: a PEM chain (leaf first) and its key; "" = plain HTTP.
    # Re-read when either file changes, from the next connection on
    api_tls_cert: str = ""
    api_tls_key: str = ""
    # mutual TLS: API clients must present a certificate signed by a CA in this PEM file
    api_client_ca: str = ""
    # audit accepted reads (GET) too; refused reads and every write are always audited
    api_audit_reads: bool = True
    # largest upload accepted (certificate chain and key together), in bytes
    max_upload_bytes: int = 262_144
    # most certificates in an upload, leaf included
    max_chain: int = 6
    # smallest RSA key accepted in an upload, in bits
    min_rsa_bits: int = 2048
    # an upload whose notBefore is at most this far in the future is accepted (CA clock skew), s
    not_before_grace: float = 0.0
    # an upload whose notAfter passed at most this long ago is accepted, s
    expiry_grace: float = 0.0
    # data keys encrypting private keys in Redis (`certagent keys generate`); "" = stored plain
    key_file: str = ""
    # HAProxy's tls-ticket-keys file, written by the agent (the fleet's session-ticket keys);
    # "" = no shared ticket keys (haproxy.cfg made before they existed)
    tls_keys_file: str = ""
    # seconds between ticket-key rotations (each key encrypts for one interval and decrypts
    # for two more); at least 600, and at least HAProxy's tune.ssl.lifetime
    ticket_key_rotation: float = 3600.0
    # directory store: "auto" = inotify (polling where it cannot be used), "poll" = always poll
    dir_watch: str = "auto"
    # directory store: seconds between rescans when polling (not used while inotify works)
    dir_poll_interval: float = 5.0
    # --- on-demand issuance (ACME), docs/acme.md --------------------------------------
    # the CA's ACME directory URL; "" = no issuance (names the store lacks get the fallback)
    acme_directory: str = ""
    # the account's contact address (optional; the CA may mail about expiry or problems)
    acme_email: str = ""
    # a PEM file of CA certificates trusted for the ACME server (private or test CAs)
    acme_ca_file: str = ""
    # external account binding, for CAs that require it: the key id, and a file holding
    # the base64url HMAC key (mode 0600)
    acme_eab_kid: str = ""
    acme_eab_hmac_file: str = ""
    # key types to order for each name: ecdsa (P-256), rsa (2048) or both; a new key each time
    acme_key_types: str = "ecdsa"
    # an ACME profile the CA offers (e.g. "shortlived"); "" = the CA's default
    acme_profile: str = ""
    # how the CA validates: http-01 (fe_http answers from a map) or tls-alpn-01 (fe_tls)
    acme_challenge: str = "http-01"
    # a first connection waits at most this long for its certificate (s); below hold
    acme_wait: float = 8.0
    # permission policy (at least one): an endpoint asked GET <url>?domain=<name> (2xx allows),
    acme_ask: str = ""
    # ... names under these domains (space or comma separated),
    acme_allow_suffixes: str = ""
    # ... and names registered with `certagent domain add` / POST /v1/domains
    acme_registered: bool = False
    # the ask endpoint: timeout (s), requests per second at most
    acme_ask_timeout: float = 2.0
    acme_ask_rate: float = 10.0
    # how long an allowed / a denied answer is cached (s)
    acme_allow_ttl: float = 3600.0
    acme_deny_ttl: float = 300.0
    # open orders in the whole fleet, at most
    acme_concurrency: int = 10
    # one order, from newOrder to the certificate (s)
    acme_order_timeout: float = 60.0
    # after a failed order the name waits this long, doubling up to the max (s)
    acme_backoff_min: float = 10.0
    acme_backoff_max: float = 3600.0
    # the fleet's issuance budget, counted in the store (0 = no limit): orders per hour,
    # orders per week under one registered domain (eTLD+1), and the share of both that
    # only renewals may use (new names get the rest)
    acme_rate_per_hour: int = 0
    acme_domain_per_week: int = 0
    acme_renewal_reserve: float = 0.2
    # this agent's name in the fleet (challenge acks, leases); "" = host name + agent socket
    acme_node: str = ""
    # the HTTP-01 answers' map file exactly as written in haproxy.cfg ("" = no fe_http)
    challenge_map: str = ""
    # crt-list slots kept for TLS-ALPN-01 answers (each serves one name being validated)
    challenge_slots: int = 4
    # --- renewal of ACME-managed certificates (with acme_directory), docs/acme.md ----------
    # seconds between reads of the renewal schedule; 0 = this node does not renew
    renew_tick: float = 10.0
    # due entries read per tick, and renewals running on this node at once, at most
    renew_batch: int = 100
    renew_concurrency: int = 4
    # renewal moves by up to this share of the lifetime either way of 2/3 (1/2 under 10 days)
    renew_jitter: float = 0.05
    # the CA's renewalInfo (ARI) is asked again after its Retry-After, clamped to these (s)
    renew_ari_min: float = 60.0
    renew_ari_max: float = 86400.0
    # after a failed renewal: retry after this, doubling up to the max (s) ...
    renew_retry_min: float = 60.0
    renew_retry_max: float = 21600.0
    # ... never planned later than this long before expiry (s)
    renew_margin: float = 3600.0
    # an entry this long past its renewal time counts as overdue (status, metrics) (s)
    renew_overdue_grace: float = 3600.0

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ConfigError("capacity must be at least 1")
        if self.fallback not in FALLBACKS:
            raise ConfigError(
                f"fallback must be one of {', '.join(FALLBACKS)}, not {self.fallback!r}"
            )
        if not 0 < self.hold <= MAX_HOLD or self.haproxy_timeout <= 0:
            raise ConfigError(
                f"hold must be between 0 and {MAX_HOLD:.0f} s and haproxy_timeout positive"
            )
        if not 60 <= self.http3_max_age <= 86400:
            raise ConfigError(
                f"http3_max_age must be between 60 s and 86400 s (a day), not {self.http3_max_age}"
            )
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log_format must be text or json, not {self.log_format!r}")
        if not isinstance(self.dual_certs, DualCerts):  # built in code, from a string
            dual = _choice(DualCerts, "dual_certs", self.dual_certs)
            object.__setattr__(self, "dual_certs", dual)
        if self.lookup_rate <= 0 or self.wildcard_hosts < 0:
            raise ConfigError("lookup_rate must be positive and wildcard_hosts at least 0")
        if self.victim_samples < 1 or self.rewarm_max < 0 or self.max_waiting_loads < 1:
            raise ConfigError(
                "victim_samples and max_waiting_loads must be at least 1, rewarm_max at least 0"
            )
        if not self.slot_prefix.startswith("/") or any(
            self.slot_prefix.endswith(ext) for ext in (".crt", ".key", ".ocsp", ".issuer", ".sctl")
        ):
            raise ConfigError("slot_prefix must be an absolute name like /certagent/slot-")
        if not 1 <= self.load_batch <= 256:
            raise ConfigError("load_batch must be between 1 and 256")
        if self.haproxy_bufsize < 4096:
            raise ConfigError("haproxy_bufsize must be at least 4096 (HAProxy's tune.bufsize)")
        parse_bind(self.api_bind)
        if bool(self.api_tls_cert) != bool(self.api_tls_key):
            raise ConfigError(
                "api_tls_cert and api_tls_key go together: set both (the API's certificate"
                " chain and its key) or neither (plain HTTP)"
            )
        if self.api_client_ca and not self.api_tls_cert:
            raise ConfigError(
                "api_client_ca (mutual TLS) needs the API served over TLS: set api_tls_cert"
                " and api_tls_key too"
            )
        if self.metrics_bind:
            parse_bind(self.metrics_bind, "metrics_bind")
        if not 0 < self.expiry_warning_days <= 365:
            raise ConfigError("expiry_warning_days must be between 0 and 365")
        if self.max_upload_bytes < 1024:
            raise ConfigError("max_upload_bytes must be at least 1024")
        if self.max_chain < 1:
            raise ConfigError("max_chain must be at least 1 (the leaf)")
        if self.min_rsa_bits < 1024:
            raise ConfigError("min_rsa_bits must be at least 1024")
        if self.not_before_grace < 0 or self.expiry_grace < 0:
            raise ConfigError("not_before_grace and expiry_grace must not be negative")
        if self.dir_watch not in DIR_WATCH_MODES:
            raise ConfigError(
                f"dir_watch must be one of {', '.join(DIR_WATCH_MODES)}, not {self.dir_watch!r}"
            )
        if not MIN_TICKET_ROTATION <= self.ticket_key_rotation <= 7 * 86400:
            raise ConfigError(
                f"ticket_key_rotation must be between {MIN_TICKET_ROTATION:.0f} s and 7 days"
                " (a ticket must outlive its lifetime, tune.ssl.lifetime: 300 s by default)"
            )
        if self.tls_keys_file and not self.tls_keys_file.startswith("/"):
            raise ConfigError(f"tls_keys_file must be an absolute path, not {self.tls_keys_file!r}")
        if not 0.1 <= self.dir_poll_interval <= 3600:
            raise ConfigError("dir_poll_interval must be between 0.1 and 3600 seconds")
        if self.acme_directory:
            self._check_acme()

    def _check_acme(self) -> None:
        """The issuance settings hang together (only when ``acme_directory`` is set)."""
        if not (self.acme_ask or self.acme_allow_suffixes or self.acme_registered):
            raise ConfigError(
                "on-demand issuance needs a permission policy, so that no made-up name"
                " reaches the CA: set acme_ask (an endpoint asked per name),"
                " acme_allow_suffixes, or acme_registered = true (names registered with"
                " 'certagent domain add')"
            )
        if self.acme_key_types not in ACME_KEY_TYPES:
            raise ConfigError(
                f"acme_key_types must be one of {', '.join(ACME_KEY_TYPES)},"
                f" not {self.acme_key_types!r}"
            )
        if self.acme_challenge not in ACME_CHALLENGES:
            raise ConfigError(
                f"acme_challenge must be one of {', '.join(ACME_CHALLENGES)},"
                f" not {self.acme_challenge!r}"
            )
        if self.acme_challenge == "http-01" and not self.challenge_map:
            raise ConfigError(
                "acme_challenge is http-01 but no challenge_map is set: re-run"
                " 'certagent init' with --acme-directory to generate fe_http and its map"
            )
        # the connection waits in HAProxy for the agent's answer: inspect-delay > the Lua
        # socket timeout > hold (both rendered from hold by init) > acme_wait + a load
        if not 0 < self.acme_wait <= self.hold - ACME_LOAD_MARGIN:
            raise ConfigError(
                f"acme_wait ({self.acme_wait:g} s) must be positive and at most hold minus"
                f" {ACME_LOAD_MARGIN:g} s ({self.hold - ACME_LOAD_MARGIN:g} s): the first"
                " connection must still have time to load the certificate before HAProxy's"
                " Lua timeout and inspect-delay (rendered from hold by 'certagent init')"
            )
        if self.acme_concurrency < 1 or self.challenge_slots < 1:
            raise ConfigError("acme_concurrency and challenge_slots must be at least 1")
        if self.acme_order_timeout <= 0 or self.acme_ask_timeout <= 0 or self.acme_ask_rate <= 0:
            raise ConfigError(
                "acme_order_timeout, acme_ask_timeout and acme_ask_rate must be positive"
            )
        if not 0 < self.acme_backoff_min <= self.acme_backoff_max:
            raise ConfigError("acme_backoff_min must be positive and at most acme_backoff_max")
        if self.acme_allow_ttl < 0 or self.acme_deny_ttl < 0:
            raise ConfigError("acme_allow_ttl and acme_deny_ttl must not be negative")
        if self.acme_rate_per_hour < 0 or self.acme_domain_per_week < 0:
            raise ConfigError(
                "acme_rate_per_hour and acme_domain_per_week must be 0 (no limit) or more"
            )
        if not 0 <= self.acme_renewal_reserve < 1:
            raise ConfigError("acme_renewal_reserve must be at least 0 and below 1 (a share)")
        if bool(self.acme_eab_kid) != bool(self.acme_eab_hmac_file):
            raise ConfigError("acme_eab_kid and acme_eab_hmac_file go together: set both")
        self._check_renew()

    def _check_renew(self) -> None:
        if self.renew_tick < 0 or self.renew_batch < 1 or self.renew_concurrency < 1:
            raise ConfigError(
                "renew_tick must not be negative, renew_batch and renew_concurrency at least 1"
            )
        if not 0 <= self.renew_jitter <= 0.15:
            raise ConfigError("renew_jitter must be between 0 and 0.15 (a share of the lifetime)")
        if not 0 < self.renew_ari_min <= self.renew_ari_max:
            raise ConfigError("renew_ari_min must be positive and at most renew_ari_max")
        if not 0 < self.renew_retry_min <= self.renew_retry_max:
            raise ConfigError("renew_retry_min must be positive and at most renew_retry_max")
        if self.renew_margin < 0 or self.renew_overdue_grace < 0:
            raise ConfigError("renew_margin and renew_overdue_grace must not be negative")


def parse_bind(value: str, what: str = "api_bind") -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) -> ``(host, port)``; ConfigError if malformed.

    Port 0 asks the kernel for a free port (tests).
    """
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(
            f"{what} must be host:port, e.g. 127.0.0.1:8089 or [::1]:8089, not {value!r}"
        )
    return host, int(port)


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


_E = TypeVar("_E", bound=StrEnum)


def _choice(kind: type[_E], key: str, value: str) -> _E:
    """``value`` as a member of ``kind``; ConfigError naming the choices if it is none."""
    try:
        return kind(value)
    except ValueError as exc:
        choices = ", ".join(m.value for m in kind)
        raise ConfigError(f"{key} must be one of {choices}, not {value!r}") from exc


def _coerce(key: str, value: Any, source: str) -> Any:
    kind = type(getattr(Settings(), key))
    if issubclass(kind, StrEnum):
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {key} must be a str, got {value!r}")
        return _choice(kind, f"{source}: {key}", value)
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower()
            if word in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return word in ("1", "true", "yes", "on")
        if kind is int and not isinstance(value, bool):
            return int(value)
        if kind is float and not isinstance(value, bool):
            return float(value)
        if kind is str and isinstance(value, str):
            return value
    except ValueError as exc:
        raise ConfigError(f"{source}: {key} must be a {kind.__name__}, got {value!r}") from exc
    raise ConfigError(f"{source}: {key} must be a {kind.__name__}, got {value!r}")


def load(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``path`` (optional) and ``environ`` (default: ``os.environ``)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(
                f"config file {path} not found; create it with 'certagent init'"
            ) from exc
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        for key, value in data.items():
            if key in RETIRED:
                raise ConfigError(f"{path}: {key} is no longer a setting: {RETIRED[key]}")
            if key not in _FIELDS:
                raise ConfigError(f"{path}: unknown key {key!r}; see docs/configuration.md")
            values[key] = _coerce(key, value, str(path))
    for key in _FIELDS:
        env = f"CERTAGENT_{key.upper()}"
        if env in environ:
            values[key] = _coerce(key, environ[env], env)
    return Settings(**values)


def to_toml(settings: Settings) -> str:
    """Render settings as a TOML file (used by ``certagent init``)."""
    lines = []
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, str):
            rendered = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif isinstance(value, bool):
            rendered = "true" if value else "false"
        else:
            rendered = repr(value)
        lines.append(f"{f.name} = {rendered}")
    return "\n".join(lines) + "\n"
