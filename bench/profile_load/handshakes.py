"""q3: HAProxy CPU of the first handshakes on a freshly committed certificate.

Each round commits a fresh certificate (a never-seen name) into ``hs_hosts`` slots,
then makes one full handshake per host three times over (TLS 1.2+, no resumption):
does the first cost more than the second and third (work HAProxy or OpenSSL does
lazily on a new certificate)?  ECDSA P-256 and RSA-2048, in turn.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import statistics
import time
from collections.abc import Sequence
from typing import Any

from cryptography import x509

from bench import _runtime_api as api
from bench._proc import schedstat_ns
from bench.profile_load.rig import ProfiledHAProxy, slot
from bench.profile_load.session import ratio_summary, summary
from bench.profile_load.settings import say
from certagent.testing.certs import KeyType

KEY_TYPES: dict[KeyType, str] = {"ec": "ECDSA P-256", "rsa": "RSA-2048"}


def client_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the served leaf is compared byte for byte instead
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def load_fresh(
    rig: ProfiledHAProxy, slots: Sequence[str], key_type: KeyType, prefix: str
) -> list[tuple[str, bytes]]:
    """Commit a fresh certificate (new name) into each slot; return (host, leaf DER) pairs."""
    hosts: list[tuple[str, bytes]] = []
    steps: list[api.Step] = []
    for s in slots:
        name = rig.unique(prefix) + ".test"
        pem, der = rig.certs.pem_and_der(name, key_type)
        hosts.append((name, der))
        steps += api.load(s, pem)
    rig.session.run(steps, "fresh loads")
    return hosts


def handshakes(rig: ProfiledHAProxy, hosts: Sequence[tuple[str, bytes]]) -> tuple[float, float]:
    """One full handshake per host, in turn; (worker CPU µs, client wall ms) per handshake."""
    ctx = client_context()
    time.sleep(0.003)
    cpu_before, started = schedstat_ns(rig.pid), time.perf_counter()
    for name, der in hosts:
        with (
            socket.create_connection(("127.0.0.1", rig.port), timeout=5) as sock,
            ctx.wrap_socket(sock, server_hostname=name) as tls,
        ):
            served = tls.getpeercert(binary_form=True)
            version = str(tls.version())
            rig.tls_versions[version] = rig.tls_versions.get(version, 0) + 1
            with contextlib.suppress(OSError):
                tls.recv(1)  # session tickets, then HAProxy closes (no server)
        if served != der:
            raise RuntimeError(f"{name} was not served its own certificate")
    wall = time.perf_counter() - started
    time.sleep(0.003)
    cpu_us = (schedstat_ns(rig.pid) - cpu_before) / 1000.0
    return cpu_us / len(hosts), wall * 1000 / len(hosts)


def verified_handshake(rig: ProfiledHAProxy, host: str) -> dict[str, Any]:
    """A handshake verified against the pool root only (so the intermediate must be sent)."""
    ctx = ssl.create_default_context(cafile=str(rig.certs.pki.cafile))
    with (
        socket.create_connection(("127.0.0.1", rig.port), timeout=5) as sock,
        ctx.wrap_socket(sock, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        subject = (
            "" if der is None else x509.load_der_x509_certificate(der).subject.rfc4514_string()
        )
        return {
            "host": host,
            "verified": True,  # wrap_socket raises if the chain does not verify
            "served_leaf_matches": der is not None and host in subject,
            "tls": tls.version(),
        }


def first_handshakes(rig: ProfiledHAProxy) -> dict[str, Any]:
    """``hs_rounds`` rounds per key type of fresh loads then handshakes #1, #2, #3."""
    params = rig.params
    slots = [slot(i) for i in range(1, 1 + params.hs_hosts)]
    say(
        f"q3: {params.hs_rounds} rounds x {params.hs_hosts} fresh certificates, handshakes"
        " #1 #2 #3 each, ECDSA and RSA-2048"
    )
    cpu: dict[str, dict[str, list[float]]] = {}
    wall: dict[str, list[float]] = {}
    for round_ in range(params.hs_rounds):
        for key_type, label in KEY_TYPES.items():
            rig.budget.check(f"q3 round {round_}", 5)
            rig.alive()
            hosts = load_fresh(rig, slots, key_type, f"hs-{key_type}-")
            per_handshake = cpu.setdefault(label, {"1st": [], "2nd": [], "3rd": []})
            for which in ("1st", "2nd", "3rd"):
                cpu_us, ms = handshakes(rig, hosts)
                per_handshake[which].append(cpu_us)
                wall.setdefault(label, []).append(ms)
    out: dict[str, Any] = {"hosts_per_round": params.hs_hosts, "rounds": params.hs_rounds}
    for label, by_rank in cpu.items():
        first, second, third = by_rank["1st"], by_rank["2nd"], by_rank["3rd"]
        out[label] = {
            "first_handshake": summary(first),
            "second_handshake": summary(second),
            "third_handshake": summary(third),
            "first_minus_second": summary([a - b for a, b in zip(first, second, strict=True)]),
            "ratio_first_to_second": ratio_summary(
                [a / b for a, b in zip(first, second, strict=True)]
            ),
            "ratio_third_to_second": ratio_summary(
                [a / b for a, b in zip(third, second, strict=True)]
            ),
            "client_wall_ms_per_handshake_median": round(statistics.median(wall[label]), 2),
        }
    return out
