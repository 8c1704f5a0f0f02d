"""Command line: ``certagent init | run | check | status``.

The only place that configures logging.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from agent import __version__, config
from agent.certcli import CERT_COMMANDS, add_cert_commands, run_cert_command
from agent.errors import AgentError
from agent.runtime import protocol
from agent.runtime.client import probe_identity, query
from agent.scaffold import InitOptions, init
from agent.store import open_configured

log = logging.getLogger("agent")

CONFIG_HELP = (
    "certagent.toml written by 'certagent init' (keys can be overridden by CERTAGENT_* variables)"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
        "crt-list and map, and a self-signed default certificate. Then run "
        "'haproxy -W -db -f DIR/haproxy.cfg' and 'certagent run --config DIR/certagent.toml'.",
    )
    pi.add_argument("directory", metavar="DIR", type=Path)
    pi.add_argument(
        "--bind", required=True, metavar="ADDR:PORT", help="public TLS address, e.g. 127.0.0.1:8443"
    )
    pi.add_argument(
        "--store",
        required=True,
        metavar="URL",
        help="redis://HOST:PORT/DB, or file:///DIR (or a plain directory path)",
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
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="directory for the unix sockets (default DIR/run)",
    )

    pr = sub.add_parser(
        "run", help="run the agent daemon", description="Run the agent until SIGTERM/SIGINT."
    )
    pr.add_argument("--config", required=True, type=Path, help=CONFIG_HELP)

    pc = sub.add_parser(
        "check",
        help="exit 0 if HAProxy, the store and the config are usable, else 1",
        description="Check the config, HAProxy's runtime socket (crt-list and map known) "
        "and the store.",
    )
    pc.add_argument("--config", required=True, type=Path, help=CONFIG_HELP)

    ps = sub.add_parser(
        "status",
        help="ask the running agent: pool usage, counters, HAProxy pid",
        description="Ask the running agent over its unix socket.",
    )
    ps.add_argument("--config", required=True, type=Path, help=CONFIG_HELP)
    ps.add_argument("--json", action="store_true", help="print the raw JSON")
    add_cert_commands(sub)
    return p


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


async def _check(settings: config.Settings) -> bool:
    ok = True
    try:
        ident = await probe_identity(settings.haproxy_socket)
        print(f"ok    HAProxy {ident.version} pid {ident.pid} at {settings.haproxy_socket}")
        crtlist = await query(settings.haproxy_socket, "show", "ssl", "crt-list")
        if settings.crt_list not in crtlist.splitlines():
            print(f"FAIL  crt-list {settings.crt_list} is not in HAProxy's configuration")
            ok = False
        else:
            print(f"ok    crt-list {settings.crt_list}")
        maps = await query(settings.haproxy_socket, "show", "map")
        if f"({settings.map_file})" not in maps and settings.map_file not in maps:
            print(f"FAIL  map {settings.map_file} is not in HAProxy's configuration")
            ok = False
        else:
            print(f"ok    map {settings.map_file}")
        protocol.parse_show_table(
            await query(settings.haproxy_socket, "show", "table", settings.usage_table)
        )
    except AgentError as exc:
        print(f"FAIL  HAProxy: {exc}")
        ok = False
    store = open_configured(settings)
    try:
        await store.ping()
        print(f"ok    store {store.describe()}")
    except AgentError as exc:
        print(f"FAIL  store {store.describe()}: {exc}")
        ok = False
    finally:
        await store.close()
    return ok


async def _status(settings: config.Settings) -> dict[str, Any]:
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(settings.agent_socket), 2
        )
        writer.write(b"status\n")
        line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
    except (OSError, TimeoutError) as exc:
        raise AgentError(
            f"agent not reachable at {settings.agent_socket}: {exc}; is 'certagent run' up?"
        ) from exc
    result: dict[str, Any] = json.loads(line)
    return result


def _print_status(st: dict[str, Any]) -> None:
    e, ld = st["ensure"], st["loader"]
    print(f"agent pid      {st['agent_pid']}")
    print(f"haproxy        pid {st['haproxy_pid']} ({st['haproxy_version']})")
    print(f"store          {st['store']}")
    print(
        f"slots          {st['slots_used']} / {st['capacity']} ({st['hosts_mapped']} hosts mapped)"
    )
    print(
        f"requests       {e['requests']}: hits {e['hits']}, loaded {e['loaded']},"
        f" unknown {e['unknown']} (+{e['negative_hits']} cached), busy {e['busy']},"
        f" invalid {e['invalid']}, errors {e['errors']}"
    )
    print(
        f"haproxy loads  {ld['loads']} ({ld['recycles']} recycled slots,"
        f" {ld['map_only']} map-only), failures {ld['failures']}, resyncs {ld['resets']}"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in CERT_COMMANDS:
        return run_cert_command(args)
    try:
        if args.command == "init":
            settings = init(
                InitOptions(
                    args.directory,
                    args.bind,
                    args.store,
                    args.capacity,
                    args.fallback,
                    args.backend,
                    args.run_dir,
                )
            )
            d = args.directory.resolve()
            print(f"wrote {d}/haproxy.cfg and {d}/certagent.toml (store {settings.store})")
            print(f"start:  haproxy -W -db -f {d}/haproxy.cfg")
            print(f"        certagent run --config {d}/certagent.toml")
            return 0
        settings = config.load(args.config)
        _setup_logging(settings.log_level)
        if args.command == "run":
            from agent.daemon import run

            asyncio.run(run(settings))
            return 0
        if args.command == "check":
            return 0 if asyncio.run(_check(settings)) else 1
        if args.command == "status":
            st = asyncio.run(_status(settings))
            if args.json:
                print(json.dumps(st, indent=2, sort_keys=True))
            else:
                _print_status(st)
            return 0
    except AgentError as exc:
        print(f"certagent: error: {exc}", file=sys.stderr)
        return 1
    raise AssertionError(args.command)  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
