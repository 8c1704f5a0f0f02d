"""Settings: a TOML file, overridden key by key by ``CERTAGENT_<KEY>`` environment variables.

Loaded once into a frozen :class:`Settings`; every key is documented in
``docs/configuration.md``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.errors import ConfigError

FALLBACKS = ("default-cert", "reject")


@dataclasses.dataclass(frozen=True)
class Settings:
    # where certificates come from: redis://host:port/db, or file:///dir (or a plain path)
    store: str = "file:///var/lib/certagent/certs"
    # Redis key prefix (Redis store only)
    redis_prefix: str = "certagent:"
    # HAProxy runtime socket (stats socket ... level admin)
    haproxy_socket: str = "/run/certagent/admin.sock"
    # the agent's own unix socket, asked by the Lua action and by `certagent status`
    agent_socket: str = "/run/certagent/agent.sock"
    # crt-list and map exactly as written in haproxy.cfg
    crt_list: str = "/etc/certagent/certagent.crtlist"
    map_file: str = "/etc/certagent/loaded.map"
    # stick-table recording SNI usage (the public frontend's name) and its expire, in ms
    usage_table: str = "fe_sni"
    usage_expire_ms: int = 3_600_000
    # how often at most the usage table is read when recycling slots (s)
    usage_refresh: float = 0.25
    # at most this many certificates held in HAProxy
    capacity: int = 1000
    # name prefix of the agent's certificate slots inside HAProxy
    slot_prefix: str = "/certagent/slot-"
    # names absent from the store are not looked up again for this long (s), at most this many
    negative_ttl: float = 30.0
    negative_cache_size: int = 100_000
    # a load that cannot start within this many seconds answers "busy" (keep < Lua timeout)
    load_deadline: float = 1.0
    # at most this many loads waiting for the writer; more answer "busy" at once
    max_waiting_loads: int = 256
    # at most this many queued loads are sent to HAProxy in one pipelined batch
    load_batch: int = 32
    # HAProxy's tune.bufsize: command + PEM must fit
    haproxy_bufsize: int = 16384
    # runtime-API reply timeout (s)
    haproxy_timeout: float = 5.0
    # how often HAProxy's identity is checked to notice reloads and restarts (s)
    watch_interval: float = 0.5
    # what clients get when no certificate can be loaded (used by `certagent init`)
    fallback: str = "default-cert"
    log_level: str = "info"
    # REST API listen address, host:port ([::1]:8089 for IPv6); served only with api_tokens_file
    api_bind: str = "127.0.0.1:8089"
    # REST API bearer tokens, "name:sha256hex" lines (`certagent token add`); "" = no REST API
    api_tokens_file: str = ""
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

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ConfigError("capacity must be at least 1")
        if self.fallback not in FALLBACKS:
            raise ConfigError(
                f"fallback must be one of {', '.join(FALLBACKS)}, not {self.fallback!r}"
            )
        if self.load_deadline <= 0 or self.haproxy_timeout <= 0 or self.watch_interval <= 0:
            raise ConfigError("load_deadline, haproxy_timeout and watch_interval must be positive")
        if not self.slot_prefix.startswith("/") or any(
            self.slot_prefix.endswith(ext) for ext in (".crt", ".key", ".ocsp", ".issuer", ".sctl")
        ):
            raise ConfigError("slot_prefix must be an absolute name like /certagent/slot-")
        if not 1 <= self.load_batch <= 256:
            raise ConfigError("load_batch must be between 1 and 256")
        if self.haproxy_bufsize < 4096:
            raise ConfigError("haproxy_bufsize must be at least 4096 (HAProxy's tune.bufsize)")
        parse_bind(self.api_bind)
        if self.max_upload_bytes < 1024:
            raise ConfigError("max_upload_bytes must be at least 1024")
        if self.max_chain < 1:
            raise ConfigError("max_chain must be at least 1 (the leaf)")
        if self.min_rsa_bits < 1024:
            raise ConfigError("min_rsa_bits must be at least 1024")
        if self.not_before_grace < 0 or self.expiry_grace < 0:
            raise ConfigError("not_before_grace and expiry_grace must not be negative")


def parse_bind(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) -> ``(host, port)``; ConfigError if malformed.

    Port 0 asks the kernel for a free port (tests).
    """
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(
            f"api_bind must be host:port, e.g. 127.0.0.1:8089 or [::1]:8089, not {value!r}"
        )
    return host, int(port)


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _coerce(key: str, value: Any, source: str) -> Any:
    kind = type(getattr(Settings(), key))
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            return str(value).lower() in ("1", "true", "yes", "on")
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
        else:
            rendered = repr(value)
        lines.append(f"{f.name} = {rendered}")
    return "\n".join(lines) + "\n"
