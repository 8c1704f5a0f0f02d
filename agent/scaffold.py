"""``certagent init DIR``: write a complete, working HAProxy + certagent setup."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from importlib import resources
from pathlib import Path
from string import Template

from agent import config
from agent.errors import ConfigError
from agent.keycrypt import generate_key_line
from agent.selfsigned import self_signed

# Unix socket paths must fit sockaddr_un.sun_path (108 bytes with the NUL).
MAX_SOCKET_PATH = 100
INSPECT_DELAY_MS = 5000
LUA_TIMEOUT_MS = 3000


@dataclasses.dataclass(frozen=True)
class InitOptions:
    directory: Path
    bind: str
    store: str
    capacity: int = 1000
    fallback: str = "default-cert"
    backend: str | None = None  # host:port of the operator's HTTP backend; None = built-in 200
    run_dir: Path | None = None
    bufsize: int = 16384


def _template(name: str) -> str:
    return resources.files("agent").joinpath("templates", name).read_text()


def _check_bind(bind: str) -> None:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--bind {bind!r}: expected ADDR:PORT, e.g. 127.0.0.1:8443")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError as exc:
        raise ConfigError(f"--bind {bind!r}: {host!r} is not an IP address") from exc


def default_certificate() -> bytes:
    """A self-signed ECDSA P-256 certificate + key that clients see as the fallback."""
    return self_signed("certagent default certificate")


def _write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def init(opts: InitOptions) -> config.Settings:
    """Write haproxy.cfg, certagent.toml, the Lua action, crt-list, map and default cert."""
    _check_bind(opts.bind)
    if opts.backend is not None:
        _check_bind(opts.backend)
    directory = opts.directory.resolve()
    run_dir = (opts.run_dir or directory / "run").resolve()
    for sock in ("admin.sock", "agent.sock", "tls.sock"):
        if len(str(run_dir / sock)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"socket path {run_dir / sock} is too long for a unix socket; "
                "pass a shorter --run-dir (e.g. /run/certagent)"
            )
    directory.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)

    store = opts.store
    key_file = ""
    if "://" not in store or store.startswith("file://"):
        store_dir = Path(store.removeprefix("file://")).resolve()
        store_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(store_dir, 0o700)
        store = f"file://{store_dir}"
    else:  # Redis: private keys are encrypted at rest with a data key of our own
        key_path = directory / "data.key"
        if not key_path.exists():
            _write(key_path, generate_key_line("k1") + "\n", mode=0o600)
        key_file = str(key_path)

    settings = config.Settings(
        store=store,
        haproxy_socket=str(run_dir / "admin.sock"),
        agent_socket=str(run_dir / "agent.sock"),
        crt_list=str(directory / "certagent.crtlist"),
        map_file=str(directory / "loaded.map"),
        usage_table="fe_sni",
        capacity=opts.capacity,
        fallback=opts.fallback,
        haproxy_bufsize=opts.bufsize,
        load_deadline=1.0,
        key_file=key_file,
    )
    cfg_path = directory / "haproxy.cfg"
    lua_path = directory / "certagent.lua"
    default_cert = directory / "default.pem"
    if opts.fallback == "reject":
        fallback_rule = (
            "    # fallback = reject: close connections whose certificate could not be loaded\n"
            "    tcp-request content reject if { var(txn.certagent) -m found } "
            "!{ var(txn.certagent) -m str ok }"
        )
    else:
        fallback_rule = (
            "    # fallback = default-cert: connections whose certificate could not be\n"
            "    # loaded continue and are served the default certificate"
        )
    if opts.backend is None:
        app_backend = '    http-request return status 200 content-type text/plain string "ok\\n"'
    else:
        app_backend = f"    server app {opts.backend}"
    haproxy_cfg = Template(_template("haproxy.cfg.tmpl")).substitute(
        cfg_path=cfg_path,
        map_file=settings.map_file,
        crt_list=settings.crt_list,
        run_dir=run_dir,
        lua_path=lua_path,
        bufsize=opts.bufsize,
        bind=opts.bind,
        inspect_delay_ms=INSPECT_DELAY_MS,
        table_size=max(2 * opts.capacity, 1000),
        usage_expire_ms=settings.usage_expire_ms,
        agent_socket=settings.agent_socket,
        lua_timeout_ms=LUA_TIMEOUT_MS,
        fallback_rule=fallback_rule,
        default_cert=default_cert,
        app_backend=app_backend,
    )
    _write(cfg_path, haproxy_cfg)
    _write(lua_path, _template("certagent.lua"))
    _write(directory / "certagent.toml", config.to_toml(settings))
    for empty in (settings.crt_list, settings.map_file):
        if not Path(empty).exists():
            _write(Path(empty), "")
    if not default_cert.exists():
        _write(default_cert, default_certificate(), mode=0o600)
    return settings
