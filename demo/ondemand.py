"""The demo's on-demand part: never-seen names get a certificate from a loopback ACME CA.

Debian's ``pebble`` (a test ACME CA) and ``pebble-challtestsrv`` (its DNS, which
answers 127.0.0.1 for every name: no /etc/hosts entry is needed) start on free
loopback ports (:class:`certagent.testing.pebble.Pebble`).  The demo's agent is
set up with ``--acme-directory`` and allows names under :data:`SUFFIX`
(``acme_allow_suffixes`` in certagent.toml); pebble validates HTTP-01 against the
node's ``fe_http``.  Then each of :data:`NAMES` gets its first connection: HAProxy
holds it while the agent orders, stores and loads the certificate, and the
client verifies it against pebble's root with the hostname checked.

If pebble is missing or cannot start, :func:`start_ca` says so and returns None:
the rest of the demo runs without this part.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from certagent.testing import StackError, tlsclient
from certagent.testing.pebble import Pebble, installed

SUFFIX = "ondemand.demo.test"
NAMES = tuple(f"{label}.{SUFFIX}" for label in ("shop", "blog", "api"))
#: past the agent's hold (10 s with issuance on): a fallback still ends the handshake
HANDSHAKE_TIMEOUT = 20.0


@dataclass(frozen=True)
class DemoCa:
    pebble: Pebble
    root: Path  # pebble's root (new at every start): the only CA the client trusts here


def start_ca(workdir: Path, say: Callable[[str], None], timeout: float) -> DemoCa | None:
    """pebble + its DNS on loopback, or None (said why) if that is not possible here."""
    if not installed():
        say(
            "demo: pebble is not installed (scripts/install.sh installs it):"
            " the on-demand part is skipped"
        )
        return None
    ca = Pebble(workdir, nonce_reject=0)
    try:
        ca.start(timeout=timeout)
        root = workdir / "pebble-root.pem"
        root.write_bytes(ca.roots_pem())
    except (StackError, OSError) as exc:
        ca.stop()
        say(f"demo: pebble could not start ({exc}): the on-demand part is skipped")
        return None
    except BaseException:  # Ctrl-C while starting: nothing of it may outlive the demo
        ca.stop()
        raise
    say(
        f"demo: pebble (test ACME CA) on {ca.directory_url}, its DNS on"
        f" 127.0.0.1:{ca.dns_port} (every name -> 127.0.0.1); log in {workdir}"
    )
    return DemoCa(ca, root)


def init_args(ca: Pebble) -> list[str]:
    """``certagent init`` options: issuance from ``ca``, HTTP-01 on the port it validates."""
    return [
        "--acme-directory", ca.directory_url,
        "--acme-ca-file", str(ca.ca_file),
        "--acme-email", f"demo@{SUFFIX}",
        "--http-bind", f"127.0.0.1:{ca.http_port}",
    ]  # fmt: skip


def allow_suffix(config: Path) -> None:
    """Set ``acme_allow_suffixes`` in the certagent.toml ``certagent init`` wrote."""
    text = config.read_text()
    line = 'acme_allow_suffixes = ""\n'
    if line not in text:
        raise StackError(f"{config} has no empty acme_allow_suffixes line to fill in")
    config.write_text(text.replace(line, f'acme_allow_suffixes = "{SUFFIX}"\n'))


@dataclass
class Issued:
    name: str
    seconds: float
    issuer: str
    serial: int
    again_seconds: float  # a second connection: served by HAProxy, no issuance


@dataclass
class OnDemandResults:
    issued: list[Issued] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _timed(port: int, name: str, root: Path) -> tuple[float, tlsclient.CertInfo]:
    started = time.perf_counter()
    info = tlsclient.handshake(port, name, root, timeout=HANDSHAKE_TIMEOUT)
    return time.perf_counter() - started, info


def first_connections(port: int, root: Path, say: Callable[[str], None]) -> OnDemandResults:
    """One first connection per name of :data:`NAMES`, then a second one each."""
    results = OnDemandResults()
    say(f"demo: on demand: {len(NAMES)} names under {SUFFIX} that no store has, one at a time ...")
    for name in NAMES:
        try:
            took, info = _timed(port, name, root)
            again, second = _timed(port, name, root)
        except ssl.SSLCertVerificationError as exc:
            results.failures.append(f"on demand: {name}: fallback served ({exc.verify_message})")
            continue
        except OSError as exc:  # ssl errors and timeouts included
            results.failures.append(f"on demand: {name}: {exc}")
            continue
        if second.serial != info.serial:
            results.failures.append(f"on demand: {name}: a second certificate was served")
        results.issued.append(Issued(name, took, info.issuer_cn or "?", info.serial, again))
        say(
            f"  {name:<24} first connection {took * 1000:.0f} ms: issued by"
            f" {info.issuer_cn}, serial {info.serial:x}; again {again * 1000:.1f} ms"
        )
    return results


def summary_lines(results: OnDemandResults | None, status: dict[str, object]) -> list[str]:
    """The summary's on-demand lines (why it was skipped, if it was)."""
    if results is None:
        return ["on demand        skipped (pebble not available; see above)"]
    issuance = status.get("issuance")
    orders = ""
    if isinstance(issuance, dict):
        orders = (
            f"; agent: orders {issuance.get('orders_valid')} valid /"
            f" {issuance.get('orders_failed')} failed"
        )
    times = sorted(i.seconds * 1000 for i in results.issued)
    took = f", first connection {times[0]:.0f}-{times[-1]:.0f} ms" if times else ""
    return [
        f"on demand        {len(results.issued)} / {len(NAMES)} never-seen names under {SUFFIX}"
        f" issued by pebble on their first connection (verified, hostname checked){took}{orders}"
    ]
