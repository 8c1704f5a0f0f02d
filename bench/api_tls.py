"""What the REST API's TLS and audit add per connection and per request, in-process.

    .venv/bin/python -m bench.api_tls [--repeats R] [--out DIR]

Three figures, each the median of R repeats (with min and max), on the real code
(:mod:`certagent.api.tls`, :mod:`certagent.api.audit`) and a test certificate
(ECDSA P-256, the CA of ``certagent.testing.certs``):

* ``check_us``: :meth:`ServerTls.context` when nothing changed, what every new
  connection pays before its handshake (``stat`` of the certificate, key and CA);
* ``handshake_server_ms``: the server's CPU for one full TLS 1.3 handshake with
  that context (in-memory, ``ssl.MemoryBIO``: no sockets, no client time counted);
* ``audit_line_us``: one audit line (:meth:`Auditor.request`), formatted and
  written to a file, as the agent writes it for every request that needs a token.

One process, no store, no HAProxy: these are the API's own costs, to compare
with each other (their ratio), within one run.  Prints JSON on stdout and
writes ``bench/results/<date>-api-tls[-N].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import ssl
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._runinfo import RESULTS, publish, run_meta, say
from certagent.api.audit import AUDIT_LOGGER, AuditEntry, Auditor
from certagent.api.tls import ServerTls
from certagent.testing.certs import cert_pem, issue_cert, key_pem, make_ca, make_key


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.api_tls", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--repeats", type=int, default=5, help="repeats of each figure (5)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    return p.parse_args(argv)


def per_call(action: Callable[[], object], count: int) -> float:
    """Seconds of CPU per call of ``action``, over ``count`` calls."""
    started = time.process_time()
    for _ in range(count):
        action()
    return (time.process_time() - started) / count


def handshake_cpu(server: ssl.SSLContext, client: ssl.SSLContext) -> float:
    """The server side's CPU seconds for one in-memory handshake."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname="api.bench.test")
    spent = 0.0
    for _ in range(8):
        with contextlib.suppress(ssl.SSLWantReadError):
            cli.do_handshake()
        s_in.write(c_out.read())
        started = time.process_time()
        try:
            srv.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        spent += time.process_time() - started
        c_in.write(s_out.read())
        if done:
            cli.do_handshake()
            return spent
    raise RuntimeError("the in-memory handshake did not finish")


def spread(values: list[float], scale: float) -> dict[str, float]:
    return {
        "median": round(statistics.median(values) * scale, 3),
        "min": round(min(values) * scale, 3),
        "max": round(max(values) * scale, 3),
    }


def measure(repeats: int, work: Path) -> dict[str, Any]:
    ca = make_ca("bench api CA")
    key = make_key()
    leaf = issue_cert(ca, "api.bench.test", key=key)
    (work / "api.pem").write_bytes(cert_pem(leaf) + ca.chain_pem)
    (work / "api.key").write_bytes(key_pem(key))
    (work / "ca.pem").write_bytes(ca.root_pem)
    tls = ServerTls(str(work / "api.pem"), str(work / "api.key"), str(work / "ca.pem"))
    server = ServerTls(str(work / "api.pem"), str(work / "api.key")).context()
    client = ssl.create_default_context(cadata=ca.root_pem.decode())
    client.minimum_version = ssl.TLSVersion.TLSv1_3

    audit_log = logging.getLogger(AUDIT_LOGGER)
    handler = logging.FileHandler(work / "audit.log")
    before = (audit_log.level, audit_log.propagate)
    audit_log.addHandler(handler)
    audit_log.setLevel(logging.INFO)
    audit_log.propagate = False  # the file alone, as the agent's one handler
    auditor = Auditor(lambda: datetime.now(UTC))

    def audit_one() -> None:
        entry = AuditEntry("POST", "/v1/domains", "192.0.2.7", token="panel")
        entry.names = ("a.customer.test",)
        auditor.request(entry, 201)

    check, handshake, audit = [], [], []
    for repeat in range(repeats):
        say(f"repeat {repeat + 1}/{repeats}")
        check.append(per_call(tls.context, 20_000))
        handshake.append(statistics.median(handshake_cpu(server, client) for _ in range(200)))
        audit.append(per_call(audit_one, 5_000))
    audit_log.removeHandler(handler)
    audit_log.level, audit_log.propagate = before
    handler.close()
    return {
        "groups": tls.groups,
        "check_us": spread(check, 1e6),
        "handshake_server_ms": spread(handshake, 1e3),
        "audit_line_us": spread(audit, 1e6),
        "check_share_of_handshake": round(
            statistics.median(check) / statistics.median(handshake), 4
        ),
    }


def markdown(result: dict[str, Any]) -> str:
    meta, fig = result["meta"], result["figures"]
    return (
        f"# REST API: TLS and audit costs, {meta['date'][:10]}\n\n"
        f"`python -m bench.api_tls --repeats {result['repeats']}` at revision"
        f" {meta['revision']}, {meta['machine']['nproc']} CPUs ({meta['machine']['cpu_model']}),"
        " shared with other engineers' test runs (load average"
        f" {', '.join(str(x) for x in result.get('load_average', []))} at the end)."
        " Medians of the repeats, their min and max; CPU time of this process.\n\n"
        "| figure | median | min | max |\n|---|---:|---:|---:|\n"
        + "".join(
            f"| {name} | {fig[name]['median']} | {fig[name]['min']} | {fig[name]['max']} |\n"
            for name in ("check_us", "handshake_server_ms", "audit_line_us")
        )
        + f"\nThe per-connection file check is {fig['check_share_of_handshake']:.1%} of the"
        f" server's handshake CPU. Groups offered: {fig['groups']}.\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-api-tls-") as work:
        figures = measure(args.repeats, Path(work))
    result = {
        "meta": run_meta(),
        "repeats": args.repeats,
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "figures": figures,
    }
    result_md = markdown(result)
    publish(result, args.out, f"{result['meta']['date'][:10]}-api-tls", result_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
