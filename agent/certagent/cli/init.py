"""``certagent init DIR``: write a complete, working HAProxy + certagent setup (files only).

Every argument is checked before anything is written, so a refused argument
leaves nothing behind.  Directories are created mode 0700; one that exists is
left as it is (its mode too).  Files written earlier are not overwritten
without ``force``, and the secrets never are: the data key, the store's
passwords, the default certificate.  Secrets (data key, store and sentinel
passwords) are files of mode 0600; no password is written into certagent.toml.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import pwd
import shutil
import time
from pathlib import Path
from typing import Any

from certagent import config
from certagent.api.tls import server_context
from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.certs.selfsigned import default_certificate
from certagent.certs.ticketkeys import keys_file, new_ring
from certagent.cli.systemd import SystemdPlan, systemd_files
from certagent.errors import ConfigError, HAProxyError
from certagent.runtime.build import binary_build, http3_problem
from certagent.runtime.haproxycfg import HAProxyLayout, log_target, lua_source, render_haproxy_cfg
from certagent.runtime.tlspolicy import INTERMEDIATE, TlsPolicy
from certagent.store import parse_store_url

# Unix socket paths must fit sockaddr_un.sun_path (108 bytes with the NUL).
MAX_SOCKET_PATH = 100
MASTER_SOCKET = "/run/haproxy-master.sock"  # what Debian's haproxy.service passes to -S


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
    # seconds a new host's connection may wait for its certificate; None: 5, or ACME_HOLD
    hold: float | None = None
    log: str = "stdout"  # where HAProxy logs: stdout, stderr, a syslog socket path, HOST:PORT
    data_key: Path | None = None  # join a fleet: its data-key file (Redis stores)
    force: bool = False  # overwrite haproxy.cfg, certagent.toml, ... written earlier
    systemd: bool = False  # also write unit files (DIR/systemd/)
    user: str | None = None  # HAProxy's and the agent's user, when HAProxy's master is root
    tls: TlsPolicy = INTERMEDIATE  # fe_tls's protocol versions, ciphers and curves (--tls ...)
    # on-demand issuance (docs/acme.md): the CA's ACME directory URL turns it on
    acme_directory: str | None = None
    acme_email: str | None = None
    acme_ca_file: Path | None = None  # CA certificates trusted for the ACME server
    ask: str | None = None  # the permission endpoint (GET ?domain=NAME, 2xx allows)
    http_bind: str | None = None  # fe_http (HTTP-01 answers); default: port 80 on --bind's
    acme_challenge: str = "http-01"
    # HTTP/3 (--http3): QUIC binds beside the TCP one, if ``haproxy`` (the binary that will
    # run the file; default: the first on PATH) is built with QUIC; Alt-Svc max-age (s)
    http3: bool = False
    haproxy: str | None = None
    http3_max_age: int | None = None  # None: config.HTTP3_MAX_AGE
    # the REST API over TLS (docs/api.md): its certificate chain and key, and for mutual
    # TLS the CA its clients' certificates must come from
    api_tls_cert: Path | None = None
    api_tls_key: Path | None = None
    api_client_ca: Path | None = None


@dataclasses.dataclass
class InitResult:
    settings: config.Settings
    written: list[Path]
    kept: list[Path]
    data_key: str | None  # the key id of the data key, for a Redis store
    notes: list[str]


def _check_bind(bind: str, what: str = "--bind") -> None:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} {bind!r}: expected ADDR:PORT, e.g. 127.0.0.1:8443")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError as exc:
        raise ConfigError(f"{what} {bind!r}: {host!r} is not an IP address") from exc


def init(opts: InitOptions) -> InitResult:
    """Check every option, then write the setup into ``opts.directory``."""
    _check_bind(opts.bind)
    if opts.backend is not None:
        _check_bind(opts.backend, "--backend")
    try:
        haproxy_log = log_target(opts.log)
    except ValueError as exc:
        raise ConfigError(f"--log: {exc}") from exc
    store = parse_store_url(opts.store)
    owner = _user(opts.user)
    directory = opts.directory.absolute()
    run_dir = (opts.run_dir or directory / "run").absolute()
    for sock in ("admin.sock", "agent.sock", "tls.sock"):
        if len(str(run_dir / sock)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"socket path {run_dir / sock} is too long for a unix socket; "
                "pass a shorter --run-dir (e.g. /run/certagent)"
            )
    acme = _acme_settings(opts, directory)
    http3_note = _check_http3(opts)
    api_tls = _api_tls_settings(opts)
    ring: KeyRing | None = None
    if opts.data_key is not None:
        if store.kind != "redis":
            raise ConfigError("--data-key is for a Redis store (a directory keeps keys as files)")
        ring = KeyRing.from_file(opts.data_key)
    key_path = directory / "data.key"
    if ring is not None and key_path.exists() and KeyRing.from_file(key_path) != ring:
        raise ConfigError(
            f"{key_path} exists and holds other keys than {opts.data_key}; it is never"
            " overwritten (losing it loses every stored private key): move it away first"
        )
    password_path = directory / "store.password"
    sentinel_path = directory / "store-sentinel.password"
    tickets_dir = directory / "tickets"  # the agent's: it replaces the keys file atomically
    settings = config.Settings(
        store=store.url,
        store_password_file=str(password_path) if store.password else "",
        store_sentinel_password_file=str(sentinel_path) if store.sentinel_password else "",
        haproxy_socket=str(run_dir / "admin.sock"),
        haproxy_master_socket=MASTER_SOCKET if opts.systemd else "",
        agent_socket=str(run_dir / "agent.sock"),
        crt_list=str(directory / "certagent.crtlist"),
        usage_table="fe_sni",
        capacity=opts.capacity,
        fallback=opts.fallback,
        haproxy_bufsize=opts.bufsize,
        hold=_hold(opts),
        key_file=str(key_path) if store.kind == "redis" else "",
        tls_keys_file=str(tickets_dir / "tls-ticket.keys"),
        http3=opts.http3,
        http3_max_age=opts.http3_max_age or config.HTTP3_MAX_AGE,
        **acme,
        **api_tls,
    )  # validates capacity, fallback, hold, the issuance settings ...
    layout = HAProxyLayout(
        cfg_path=directory / "haproxy.cfg",
        lua_path=directory / "certagent.lua",
        run_dir=run_dir,
        crt_list=settings.crt_list,
        agent_socket=settings.agent_socket,
        default_cert=directory / "default.pem",
        bind=opts.bind,
        capacity=opts.capacity,
        usage_expire_ms=settings.usage_expire_ms,
        fallback=opts.fallback,
        backend=opts.backend,
        bufsize=opts.bufsize,
        hold=settings.hold,
        log_target=haproxy_log,
        user=opts.user,
        tls_keys=Path(settings.tls_keys_file),
        tls=opts.tls,
        http_bind=_http_bind(opts) if settings.challenge_map else None,
        challenge_map=Path(settings.challenge_map) if settings.challenge_map else None,
        acme_alpn=settings.acme_directory != "" and settings.acme_challenge == "tls-alpn-01",
        http3_max_age=settings.http3_max_age if opts.http3 else None,
    )
    config_files: dict[Path, str] = {
        layout.cfg_path: render_haproxy_cfg(layout),
        layout.lua_path: lua_source(),
        directory / "certagent.toml": config.to_toml(settings),
    }
    if opts.systemd:
        writable = (tickets_dir, *((store.directory,) if store.directory is not None else ()))
        plan = SystemdPlan(directory, run_dir, opts.user or "haproxy", MASTER_SOCKET, writable)
        config_files.update({directory / rel: text for rel, text in systemd_files(plan).items()})
    existing = sorted(p for p in config_files if p.exists())
    if existing and not opts.force:
        raise ConfigError(
            "these files exist (written by an earlier init, maybe edited since): "
            + ", ".join(str(p) for p in existing)
            + "; pass --force to overwrite them (data.key, the store's password files and"
            " default.pem are never overwritten)"
        )

    # --- everything checked: write --------------------------------------------------------
    written: list[Path] = []
    kept: list[Path] = []
    _make_dir(directory)
    _make_dir(run_dir, owner)
    _make_dir(tickets_dir, owner)
    if store.directory is not None:
        _make_dir(store.directory, owner)
    for path, text in config_files.items():
        _make_dir(path.parent)
        _write(path, text)
        written.append(path)
    once: list[tuple[Path, bytes, int]] = [  # created when missing, never overwritten
        (layout.default_cert, default_certificate(), 0o600),
        (Path(settings.crt_list), b"", 0o644),
        # HAProxy needs the file to start; the agent puts the fleet's keys in it
        (Path(settings.tls_keys_file), keys_file(new_ring(time.time())), 0o600),
    ]
    if settings.challenge_map:  # HAProxy loads it at start; the agent adds answers at runtime
        once.append((Path(settings.challenge_map), b"", 0o644))
    if store.password:
        once.append((password_path, store.password.encode() + b"\n", 0o600))
    if store.sentinel_password:
        once.append((sentinel_path, store.sentinel_password.encode() + b"\n", 0o600))
    if store.kind == "redis":
        line = _key_file_text(ring) if ring is not None else generate_key_line() + "\n"
        once.append((key_path, line.encode(), 0o600))
    for path, data, mode in once:
        if path.exists():
            kept.append(path)
            continue
        _write(path, data, mode, owner if mode == 0o600 and path != layout.default_cert else None)
        written.append(path)
    notes: list[str] = [http3_note] if http3_note else []
    kid: str | None = None
    if store.kind == "redis":
        kid = KeyRing.from_file(key_path).current
        notes.append(
            f"data key: {key_path} (key id {kid}). Back it up: losing it loses every private key"
            f" stored in Redis. Other nodes of this fleet: certagent init ... --data-key {key_path}"
        )
    if store.password:
        notes.append(f"store password: {password_path} (mode 0600), not in certagent.toml")
    if store.sentinel_password:
        notes.append(f"sentinel password: {sentinel_path} (mode 0600), not in certagent.toml")
    return InitResult(settings, written, kept, kid, notes)


def _check_http3(opts: InitOptions) -> str | None:
    """With ``--http3``: the HAProxy that will run the file serves QUIC (ConfigError if not).

    Returns a note naming the build that was checked.  ``certagent run`` checks the
    running HAProxy again.
    """
    if not opts.http3:
        for given, flag in ((opts.haproxy, "--haproxy"), (opts.http3_max_age, "--http3-max-age")):
            if given is not None:
                raise ConfigError(f"{flag} is for HTTP/3: add --http3")
        return None
    binary = opts.haproxy or shutil.which("haproxy")
    if binary is None:
        raise ConfigError(
            "--http3: no haproxy on PATH to check for QUIC; name the binary that will run"
            " this configuration with --haproxy PATH"
        )
    try:
        build = binary_build(binary)
    except HAProxyError as exc:
        raise ConfigError(f"--http3: {exc}") from exc
    problem = http3_problem(build, binary)
    if problem is not None:
        raise ConfigError(f"--http3: {problem}")
    limited = " (limited-quic: OpenSSL's QUIC compatibility layer)" if build.limited_quic else ""
    return f"HTTP/3: {build.describe()} at {binary} serves QUIC{limited}"


#: ``--hold`` with issuance on, unless given: a first connection waits for its certificate
#: (acme_wait) and then for its load; the Lua timeout and inspect-delay follow from it.
ACME_HOLD = 10.0


def _hold(opts: InitOptions) -> float:
    if opts.hold is not None:
        return opts.hold
    return ACME_HOLD if opts.acme_directory else config.Settings.hold


def _acme_settings(opts: InitOptions, directory: Path) -> dict[str, Any]:
    """The issuance settings of ``opts`` (ConfigError if unusable); {} without --acme-directory."""
    if not opts.acme_directory:
        for given, flag in (
            (opts.ask, "--ask"),
            (opts.http_bind, "--http-bind"),
            (opts.acme_email, "--acme-email"),
            (opts.acme_ca_file, "--acme-ca-file"),
        ):
            if given:
                raise ConfigError(f"{flag} is for on-demand issuance: add --acme-directory URL")
        return {}
    if not opts.acme_directory.startswith(("https://", "http://")):
        raise ConfigError(
            f"--acme-directory {opts.acme_directory[:100]!r}: expected the CA's directory URL,"
            " e.g. https://acme-staging-v02.api.letsencrypt.org/directory"
        )
    if opts.ask is not None and not opts.ask.startswith(("https://", "http://")):
        raise ConfigError(f"--ask {opts.ask[:100]!r}: expected a URL, e.g. http://127.0.0.1:9000/ask")
    if opts.http_bind is not None:
        _check_bind(opts.http_bind, "--http-bind")
    ca_file = ""
    if opts.acme_ca_file is not None:
        if not opts.acme_ca_file.is_file():
            raise ConfigError(f"--acme-ca-file {opts.acme_ca_file}: no such file")
        ca_file = str(opts.acme_ca_file.absolute())
    hold = _hold(opts)
    return {
        "acme_directory": opts.acme_directory,
        "acme_email": opts.acme_email or "",
        "acme_ca_file": ca_file,
        "acme_ask": opts.ask or "",
        "acme_registered": True,
        "acme_challenge": opts.acme_challenge,
        # the first connection waits for issuance, then its load: below hold, checked
        "acme_wait": min(config.Settings.acme_wait, hold - 2 * config.ACME_LOAD_MARGIN),
        "challenge_map": str(directory / "challenges.map")
        if opts.acme_challenge == "http-01"
        else "",
    }


def _api_tls_settings(opts: InitOptions) -> dict[str, Any]:
    """``api_tls_cert``, ``api_tls_key`` (and ``api_client_ca``) as absolute paths, once
    they load together (ConfigError otherwise); {} without ``--api-tls-cert``."""
    if (opts.api_tls_cert is None) != (opts.api_tls_key is None):
        raise ConfigError("--api-tls-cert and --api-tls-key go together: give both")
    if opts.api_tls_cert is None or opts.api_tls_key is None:
        if opts.api_client_ca is not None:
            raise ConfigError("--api-client-ca needs the API served over TLS: add --api-tls-cert")
        return {}
    paths = {
        "api_tls_cert": str(opts.api_tls_cert.absolute()),
        "api_tls_key": str(opts.api_tls_key.absolute()),
        "api_client_ca": str(opts.api_client_ca.absolute()) if opts.api_client_ca else "",
    }
    server_context(paths["api_tls_cert"], paths["api_tls_key"], paths["api_client_ca"] or None)
    return paths


def _http_bind(opts: InitOptions) -> str:
    """``--http-bind``, or port 80 on the address of ``--bind``."""
    if opts.http_bind is not None:
        return opts.http_bind
    host = opts.bind.rpartition(":")[0]
    return f"{host}:80"


def _key_file_text(ring: KeyRing) -> str:
    import base64

    lines = [f"{kid}:{base64.b64encode(key).decode('ascii')}" for kid, key in ring.keys]
    return "\n".join(lines) + "\n"


def _user(name: str | None) -> tuple[int, int] | None:
    """The uid and gid of ``name`` (files the agent must read are given to it), or None."""
    if name is None:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError as exc:
        raise ConfigError(f"--user {name!r}: no such user on this machine") from exc
    return entry.pw_uid, entry.pw_gid


def _make_dir(path: Path, owner: tuple[int, int] | None = None) -> None:
    """Create ``path`` (parents too) mode 0700; an existing directory is left as it is."""
    if path.is_dir():
        return
    path.mkdir(mode=0o700, parents=True)
    if owner is not None and os.geteuid() == 0:
        os.chown(path, *owner)


def _write(
    path: Path, data: str | bytes, mode: int = 0o644, owner: tuple[int, int] | None = None
) -> None:
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)
    os.chmod(tmp, mode)
    if owner is not None and os.geteuid() == 0:
        os.chown(tmp, *owner)
    os.replace(tmp, path)
