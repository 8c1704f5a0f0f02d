"""Command line: ``certagent init | run | check | status | tls-keys | token``.

The only place that configures logging.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from certagent import __version__, config
from certagent.cli import logs
from certagent.cli.agentsocket import SLOTS_ANSWER_TIMEOUT, ask
from certagent.cli.cert import CERT_COMMANDS, add_cert_commands, run_cert_command
from certagent.cli.domains import DOMAIN_COMMAND, add_domain_commands, run_domain_command
from certagent.cli.fleet import FLEET_COMMAND, add_fleet_commands, run_fleet_command
from certagent.cli.init import InitOptions, init
from certagent.cli.statustext import print_status
from certagent.cli.tokens import add_token_commands, run_token_command
from certagent.cli.upgrade import run_upgrade
from certagent.errors import AgentError, ConfigError
from certagent.runtime import protocol
from certagent.runtime.build import differences, http3_problem, probe_build
from certagent.runtime.client import probe_identity, query
from certagent.runtime.tlspolicy import PROFILES, TlsPolicy
from certagent.store import open_configured
from certagent.store.formats import check_known

log = logging.getLogger("certagent")

CONFIG_HELP = (
    "certagent.toml written by 'certagent init' (keys can be overridden by CERTAGENT_* variables)"
)


class Parser(argparse.ArgumentParser):
    """``allow_abbrev=False`` by default, here and in every subcommand's parser.

    Abbreviated options are a trap: ``certagent run --conf X`` would be taken
    as ``--config X``, and adding any ``--conf…`` option later would change what
    an existing script means.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def _parser() -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = Parser(
        prog="certagent",
        description="Lazy-load TLS certificates into HAProxy 2.x on the first connection "
        "that names a host.",
    )
    p.add_argument("--version", action="version", version=f"certagent {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pi = sub.add_parser(
        "init",
        help="write a working haproxy.cfg + certagent.toml setup into DIR",
        description="Write into DIR: haproxy.cfg, certagent.toml, certagent.lua, an empty "
        "crt-list, and a self-signed default certificate. Then run "
        "'haproxy -W -db -f DIR/haproxy.cfg' and 'certagent run --config DIR/certagent.toml'.",
    )
    pi.add_argument(
        "directory", metavar="DIR", type=Path, help="where to write the files (created if missing)"
    )
    pi.add_argument(
        "--bind",
        metavar="ADDR:PORT",
        help="public TLS address, e.g. 127.0.0.1:8443 (required, but with --upgrade)",
    )
    pi.add_argument(
        "--store",
        metavar="URL",
        help="redis://[:PASSWORD@]HOST:PORT/DB,"
        " redis+sentinel://HOST:PORT[,...]/SERVICE[/DB][?sentinel_password=...],"
        " redis+cluster://HOST:PORT[,...], or file:///DIR (or a plain directory path);"
        " passwords go into 0600 files, never into certagent.toml",
    )
    pi.add_argument(
        "--capacity",
        type=int,
        default=1000,
        metavar="K",
        help="most certificates HAProxy holds at once (default 1000)",
    )
    pi.add_argument(
        "--fallback",
        choices=config.FALLBACKS,
        default="default-cert",
        help="when no certificate can be loaded: serve the default certificate, or close",
    )
    pi.add_argument(
        "--backend",
        metavar="ADDR:PORT",
        help="where decrypted HTTP goes (default: a built-in '200 ok' responder)",
    )
    pi.add_argument(
        "--hold",
        type=float,
        metavar="SECONDS",
        help="how long a new host's first connection may wait for its certificate (default 5;"
        " 10 with --acme-directory); haproxy.cfg's inspect-delay and Lua timeout are derived"
        " from it",
    )
    pi.add_argument(
        "--log",
        default="stdout",
        metavar="TARGET",
        help="where HAProxy logs the connections that asked the agent and every request:"
        " stdout (default), stderr, a syslog socket path (/dev/log) or HOST:PORT (syslog/UDP)",
    )
    pi.add_argument(
        "--data-key",
        type=Path,
        metavar="FILE",
        help="join a fleet: the data-key file of the other nodes (a Redis store), copied to"
        " DIR/data.key; without it a new key is made",
    )
    pi.add_argument(
        "--upgrade",
        action="store_true",
        help="an existing DIR: rewrite what certagent owns of its haproxy.cfg (fe_sni,"
        " be_certagent_tls, fe_http, its global directives and fe_tls's bind lines) and its"
        " Lua file for this release, keep everything else, print the change; checked with"
        " haproxy -c, the old files kept as *.bak-TIME; certagent.toml is left as it is."
        " Takes --tls (and its list options) too",
    )
    pi.add_argument(
        "--dry-run",
        action="store_true",
        help="with --upgrade: print what would change, write nothing",
    )
    pi.add_argument(
        "--force",
        action="store_true",
        help="overwrite haproxy.cfg, certagent.toml and the other files an earlier init wrote"
        " (never data.key, store.password, store-sentinel.password or default.pem)",
    )
    pi.add_argument(
        "--systemd",
        action="store_true",
        help="also write systemd units into DIR/systemd/ (the agent, a drop-in for"
        " haproxy.service, tmpfiles for the run directory)",
    )
    pi.add_argument(
        "--user",
        metavar="USER",
        help="HAProxy's user (e.g. haproxy) when its master runs as root: the workers, the unix"
        " sockets, the agent and its secret files belong to it",
    )
    pi.add_argument(
        "--tls",
        choices=PROFILES,
        default="intermediate",
        help="TLS settings after Mozilla's guideline: intermediate (default; TLS 1.2 with ECDHE"
        " and AEAD ciphers only, and TLS 1.3) or modern (TLS 1.3 only); X25519MLKEM768 is"
        " offered first wherever HAProxy runs on OpenSSL 3.5+",
    )
    pi.add_argument(
        "--tls-ciphers",
        metavar="LIST",
        help="your TLS 1.2 cipher suites instead of the profile's (OpenSSL syntax, ':'-separated)",
    )
    pi.add_argument(
        "--tls-ciphersuites",
        metavar="LIST",
        help="your TLS 1.3 cipher suites instead of the profile's (':'-separated)",
    )
    pi.add_argument(
        "--tls-curves",
        metavar="LIST",
        help="your key exchange groups instead of the profile's, used as given on every HAProxy"
        " (e.g. X25519:prime256v1; a name the TLS library lacks makes HAProxy refuse the file)",
    )
    pi.add_argument(
        "--http3",
        action="store_true",
        help="also serve HTTP/3: QUIC binds on --bind's address and port (UDP) sharing the"
        " certificates, and an Alt-Svc header on every response; needs HAProxy 3.0 or later"
        " built with QUIC, checked now (--haproxy) and by 'certagent run'",
    )
    pi.add_argument(
        "--haproxy",
        metavar="PATH",
        help="with --http3: the HAProxy binary that will run this configuration, checked for"
        " QUIC (default: the haproxy first on PATH)",
    )
    pi.add_argument(
        "--http3-max-age",
        type=int,
        metavar="SECONDS",
        help=f"with --http3: the Alt-Svc max-age, how long clients try HTTP/3 first (default"
        f" {config.HTTP3_MAX_AGE}; docs/haproxy.md#http3)",
    )
    pi.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="directory for the unix sockets (default DIR/run)",
    )
    api = pi.add_argument_group(
        "the REST API over TLS (docs/api.md); the API itself runs once api_tokens_file is set"
    )
    api.add_argument(
        "--api-tls-cert",
        type=Path,
        metavar="FILE",
        help="serve the REST API over TLS (1.2+, Mozilla intermediate) with this PEM chain,"
        " leaf first; the agent re-reads it when it changes",
    )
    api.add_argument(
        "--api-tls-key", type=Path, metavar="FILE", help="the private key of --api-tls-cert (PEM)"
    )
    api.add_argument(
        "--api-client-ca",
        type=Path,
        metavar="FILE",
        help="mutual TLS: API clients must present a certificate signed by a CA in FILE (PEM)",
    )
    acme = pi.add_argument_group(
        "certificates on demand (ACME, docs/acme.md): a name the store lacks gets one from the CA"
        " on its first connection, if the permission policy allows it"
    )
    acme.add_argument(
        "--acme-directory",
        metavar="URL",
        help="the CA's ACME directory, e.g."
        " https://acme-staging-v02.api.letsencrypt.org/directory; turns issuance on",
    )
    acme.add_argument("--acme-email", metavar="ADDR", help="the ACME account's contact address")
    acme.add_argument(
        "--acme-ca-file",
        type=Path,
        metavar="FILE",
        help="CA certificates (PEM) trusted for the ACME server (a private or test CA)",
    )
    acme.add_argument(
        "--ask",
        metavar="URL",
        help="permission endpoint: GET URL?domain=NAME, any 2xx allows (names registered with"
        " 'certagent domain add' are always allowed)",
    )
    acme.add_argument(
        "--http-bind",
        metavar="ADDR:PORT",
        help="where fe_http listens: HTTP-01 answers, and a redirect to https for the rest"
        " (default: port 80 on --bind's address)",
    )
    acme.add_argument(
        "--acme-challenge",
        choices=("http-01", "tls-alpn-01"),
        default="http-01",
        help="how the CA validates a name (default http-01; tls-alpn-01 needs no port 80)",
    )

    pr = sub.add_parser(
        "run",
        help="run the agent daemon",
        description="Run the agent until SIGTERM or SIGINT. SIGHUP re-reads the log level and"
        " the API tokens file. Exits 1 at once if another agent already serves this HAProxy.",
    )
    pr.add_argument("--config", required=True, type=Path, help=CONFIG_HELP)

    pc = sub.add_parser(
        "check",
        help="exit 0 if HAProxy, the store, the agent and the config are usable, else 1",
        description="Check the config, HAProxy's runtime socket (crt-list and usage table "
        "known), the store, and that the agent answers on its socket.",
    )
    pc.add_argument("--config", required=True, type=Path, help=CONFIG_HELP)

    ps = sub.add_parser(
        "status",
        help="ask the running agent: pool usage, counters, HAProxy and store health, data keys",
        description="Ask the running agent over its unix socket. Exits 1 if the agent does not"
        " answer or if HAProxy or the store is down. Also names the data keys the agent holds"
        " and the stored records it could not decrypt (their name, id and data key).",
    )
    ps.add_argument("--config", required=True, type=Path, help=CONFIG_HELP)
    ps.add_argument(
        "--json", action="store_true", help="print the raw JSON, every slot included (O(K))"
    )
    pt = sub.add_parser(
        "tls-keys",
        help="the fleet's TLS session-ticket keys: rotate them now",
        description="Ask the running agent to rotate the session-ticket keys now (for example"
        " after a key may have leaked). Every agent on the same store pushes the new key into"
        " its HAProxy at once; sessions resumed with the previous keys keep working.",
    )
    pt.add_argument("action", choices=["rotate"], help="rotate: a new key for the fleet now")
    pt.add_argument("--config", required=True, type=Path, help=CONFIG_HELP)
    add_cert_commands(sub)
    add_domain_commands(sub)
    add_fleet_commands(sub)
    add_token_commands(sub)
    return p


async def _check(settings: config.Settings) -> bool:
    ok = True
    try:
        ident = await probe_identity(settings.haproxy_socket)
        build = await probe_build(settings.haproxy_socket, ident.version)
        print(f"ok    {build.describe()}, pid {ident.pid} at {settings.haproxy_socket}")
        for note in differences(build):
            print(f"      on this version: {note}")
        if settings.http3:
            problem = http3_problem(build, settings.haproxy_socket)
            if problem is None:
                print("ok    HTTP/3: HAProxy serves QUIC (http3 = true)")
            else:
                print(f"FAIL  HTTP/3 (http3 = true): {problem}")
                ok = False
        crtlists = await query(settings.haproxy_socket, protocol.show_crtlists())
        if settings.crt_list not in protocol.parse_show_crtlists(crtlists):
            print(f"FAIL  crt-list {settings.crt_list} is not in HAProxy's configuration")
            ok = False
        else:
            print(f"ok    crt-list {settings.crt_list}")
        table = settings.usage_table
        reply = await query(settings.haproxy_socket, protocol.show_marked(table))
        if not protocol.is_table_dump(table, reply):
            print(
                f"FAIL  usage table {table}: {reply.strip()[:120]!r}; it must be fe_sni's"
                " stick-table with 'store gpt0,conn_cnt' (re-run 'certagent init')"
            )
            ok = False
        else:
            loaded = len(protocol.parse_show_table(reply))
            print(f"ok    usage table {table} ({loaded} hosts marked loaded)")
        if settings.tls_keys_file:
            keys = settings.tls_keys_file
            held = protocol.parse_show_tls_keys(
                await query(settings.haproxy_socket, protocol.show_tls_keys(keys))
            )
            if held is None:
                print(
                    f"FAIL  ticket keys: HAProxy has no 'tls-ticket-keys {keys}' on fe_tls's bind;"
                    " sessions do not resume across nodes or reloads (re-run 'certagent init')"
                )
                ok = False
            else:
                print(f"ok    ticket keys {keys} ({len(held)} keys)")
    except AgentError as exc:
        print(f"FAIL  HAProxy: {exc}")
        ok = False
    store = open_configured(settings)
    try:
        await store.ping()
        print(f"ok    store {store.describe()}")
        board = store.fleet()
        state = await board.state()
        check_known(state, board.describe(), __version__)
        print(f"ok    store {state.describe()}, which certagent {__version__} reads")
    except AgentError as exc:
        print(f"FAIL  store {store.describe()}: {exc}")
        ok = False
    finally:
        await store.close()
    try:
        st = await _status(settings)
    except AgentError as exc:
        print(f"FAIL  agent: {exc}")
        ok = False
    else:
        print(f"ok    agent pid {st['agent_pid']} answers at {settings.agent_socket}")
    return ok


async def _status(settings: config.Settings, slots: bool = False) -> dict[str, Any]:
    if slots:
        return await ask(settings.agent_socket, b"status slots", SLOTS_ANSWER_TIMEOUT)
    return await ask(settings.agent_socket, b"status")


def main(argv: list[str] | None = None) -> int:
    """``certagent``: its exit status.  A closed stdout (``certagent cert ls | head``) is quiet."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away: say nothing more, and keep the interpreter's final
        # flush of stdout from raising again.  128 + SIGPIPE, as a shell would report.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE


def _init(args: argparse.Namespace) -> int:
    try:
        tls = TlsPolicy(args.tls, args.tls_ciphers, args.tls_ciphersuites, args.tls_curves)
    except ValueError as exc:
        raise ConfigError(f"--tls: {exc}") from exc
    if args.upgrade:
        return run_upgrade(args, tls)
    if args.dry_run:
        raise ConfigError("--dry-run is for --upgrade")
    given = (("--bind", args.bind), ("--store", args.store))
    missing = [flag for flag, value in given if not value]
    if missing:
        raise ConfigError(f"init needs {' and '.join(missing)} (or --upgrade for an existing DIR)")
    result = init(
        InitOptions(
            args.directory,
            args.bind,
            args.store,
            args.capacity,
            args.fallback,
            args.backend,
            args.run_dir,
            hold=args.hold,
            log=args.log,
            data_key=args.data_key,
            force=args.force,
            systemd=args.systemd,
            user=args.user,
            tls=tls,
            acme_directory=args.acme_directory,
            acme_email=args.acme_email,
            acme_ca_file=args.acme_ca_file,
            ask=args.ask,
            http_bind=args.http_bind,
            acme_challenge=args.acme_challenge,
            http3=args.http3,
            haproxy=args.haproxy,
            http3_max_age=args.http3_max_age,
            api_tls_cert=args.api_tls_cert,
            api_tls_key=args.api_tls_key,
            api_client_ca=args.api_client_ca,
        )
    )
    d = args.directory.absolute()
    for path in result.written:
        print(f"wrote {path}")
    for path in result.kept:
        print(f"kept  {path} (never overwritten)")
    for note in result.notes:
        print(note)
    print(f"start:  haproxy -W -db -f {d}/haproxy.cfg")
    print(f"        certagent run --config {d}/certagent.toml")
    if args.systemd:
        print(f"systemd: install the files of {d}/systemd/ (each says where), docs/operations.md")
    return 0


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command in CERT_COMMANDS:
        return run_cert_command(args)
    if args.command == DOMAIN_COMMAND:
        return run_domain_command(args)
    if args.command == FLEET_COMMAND:
        return run_fleet_command(args)
    try:
        if args.command == "init":
            return _init(args)
        if args.command == "token":
            return run_token_command(args)
        settings = config.load(args.config)
        logs.setup(settings.log_level, settings.log_format)
        if args.command == "run":
            import uvloop  # the agent's loop: less CPU per request than asyncio's own

            from certagent.service.daemon import run

            uvloop.run(run(settings, config_path=args.config))
            return 0
        if args.command == "check":
            return 0 if asyncio.run(_check(settings)) else 1
        if args.command == "tls-keys":
            answer = asyncio.run(ask(settings.agent_socket, b"tls-keys-rotate"))
            if "error" in answer:
                print(f"certagent: error: {answer['error']}", file=sys.stderr)
                return 1
            print(f"ticket keys rotated: generation {answer['generation']}")
            return 0
        if args.command == "status":
            st = asyncio.run(_status(settings, slots=args.json))
            if args.json:
                print(json.dumps(st, indent=2, sort_keys=True))
            else:
                print_status(st)
            down = [what for what in ("haproxy", "store") if not st.get(f"{what}_up", True)]
            if down:
                print(f"certagent: {' and '.join(down)} down", file=sys.stderr)
                return 1
            return 0
    except AgentError as exc:
        print(f"certagent: error: {exc}", file=sys.stderr)
        return 1
    raise AssertionError(args.command)  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
