#!/opt/certagent/bin/python
"""The docker-compose demo's one-shot seeding container (the node image, this entrypoint).

``certagent-seed`` (the compose service ``seed``, once both nodes are healthy):

1. makes a demo CA in its volume (``/seed``, kept across runs) and a certificate for
   each of ``CERTAGENT_SEED_NAMES``, and uploads each through node 1's REST API
   (``POST /v1/certificates``, the token from the compose secret);
2. waits until every node of ``CERTAGENT_SEED_NODES`` serves each name with a handshake
   verified against the demo CA (the fleet's change feed carries the upload to node 2);
3. opens the first connection for ``CERTAGENT_SEED_ONDEMAND``, a name no store has,
   which the node holds while it orders a certificate from pebble (the test CA), and
   verifies what it gets against pebble's root.

``certagent-seed roots`` prints the two roots a client needs to verify the demo: the
demo CA and pebble's current root (new at every start of pebble), e.g.
``docker-compose run --rm -T seed roots > demo-roots.pem``.

Every wait is bounded; the exit status is 1 if any step failed, with what failed.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certagent.testing import tlsclient
from certagent.testing.certs import CA, cert_pem, issue, key_pem, make_ca, make_key

#: a first connection may wait up to the node's hold (10 s with issuance on) and then some
HANDSHAKE_TIMEOUT = 20.0
SERVE_TIMEOUT = 30.0


@dataclass(frozen=True)
class Seed:
    """Where things are, from the environment the compose file gives (defaults: its own)."""

    api: str
    token_file: Path
    names: tuple[str, ...]
    nodes: tuple[tuple[str, int], ...]
    ondemand: str
    pebble_management: str
    pebble_ca: Path
    state: Path

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Seed:
        def node(spec: str) -> tuple[str, int]:
            host, _, port = spec.rpartition(":")
            return host, int(port)

        def url(key: str, default: str) -> str:
            value = env.get(key, default)
            if not value.startswith(("http://", "https://")):
                raise SystemExit(f"seed: {key}={value!r}: give an http:// or https:// URL")
            return value.rstrip("/")

        names = env.get("CERTAGENT_SEED_NAMES", "www.demo.test shop.demo.test api.demo.test")
        return cls(
            api=url("CERTAGENT_SEED_API", "http://node1:8089"),
            token_file=Path(env.get("CERTAGENT_API_TOKEN_FILE", "/run/secrets/api_token")),
            names=tuple(names.split()),
            nodes=tuple(
                node(s) for s in env.get("CERTAGENT_SEED_NODES", "node1:8443 node2:8443").split()
            ),
            ondemand=env.get("CERTAGENT_SEED_ONDEMAND", "hello.ondemand.demo.test"),
            pebble_management=url("CERTAGENT_SEED_PEBBLE", "https://pebble:15000"),
            pebble_ca=Path(env.get("CERTAGENT_ACME_CA_FILE", "/pebble/endpoint-ca.pem")),
            state=Path(env.get("CERTAGENT_SEED_DIR", "/seed")),
        )

    @property
    def demo_ca(self) -> Path:
        return self.state / "demo-ca.pem"

    @property
    def pebble_root(self) -> Path:
        return self.state / "pebble-root.pem"


def say(message: str) -> None:
    print(f"seed: {message}", flush=True)


def demo_ca(seed: Seed) -> CA:
    """The demo CA of an earlier run (in the volume), or a new one written there."""
    key_path = seed.state / "demo-ca.key"
    if seed.demo_ca.exists() and key_path.exists():
        root = x509.load_pem_x509_certificate(seed.demo_ca.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return CA(root=root, cert=root, key=key, chain=())
    ca = make_ca("certagent docker demo CA", intermediate=False)
    old = os.umask(0o077)
    try:
        key_path.write_bytes(key_pem(ca.key))
    finally:
        os.umask(old)
    seed.demo_ca.write_bytes(cert_pem(ca.root))
    return ca


def upload(seed: Seed, token: str, chain: bytes, key: bytes) -> dict[str, object]:
    """``POST /v1/certificates``; the JSON of the reply, or an error naming the status."""
    body = json.dumps({"chain": chain.decode(), "key": key.decode()}).encode()
    request = urllib.request.Request(  # noqa: S310 (http or https: Seed.from_env checks)
        f"{seed.api}/v1/certificates",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310
            answer: dict[str, object] = json.loads(reply.read())
            return answer
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        raise RuntimeError(f"POST {seed.api}/v1/certificates: {exc.code} {detail}") from exc


def wait_served(seed: Seed, name: str, cafile: Path) -> list[str]:
    """Each node's verified handshake for ``name`` (bounded); the failures, if any."""
    failures = []
    for host, port in seed.nodes:
        deadline = time.monotonic() + SERVE_TIMEOUT
        while True:
            try:
                info = tlsclient.handshake(port, name, cafile, address=host, timeout=5)
            except (OSError, ssl.SSLError) as exc:
                if time.monotonic() > deadline:
                    failures.append(f"{name} on {host}:{port}: {exc}")
                    break
                time.sleep(0.5)
                continue
            say(f"  {name} served by {host}:{port}, verified (serial {info.serial:x})")
            break
    return failures


def pebble_root(seed: Seed) -> bytes:
    """pebble's current root, from its management API (trusted through its endpoint CA)."""
    context = ssl.create_default_context(cafile=str(seed.pebble_ca))
    url = f"{seed.pebble_management}/roots/0"
    with urllib.request.urlopen(url, timeout=10, context=context) as reply:  # noqa: S310
        pem: bytes = reply.read()
    x509.load_pem_x509_certificate(pem)  # a certificate, or this raises
    return pem


def first_connection(seed: Seed) -> str | None:
    """The on-demand name's first connection on node 1; None, or what went wrong."""
    try:
        seed.pebble_root.write_bytes(pebble_root(seed))
    except (OSError, ValueError) as exc:
        return f"pebble's root: {exc}"
    host, port = seed.nodes[0]
    started = time.perf_counter()
    try:
        info = tlsclient.handshake(
            port, seed.ondemand, seed.pebble_root, address=host, timeout=HANDSHAKE_TIMEOUT
        )
    except (OSError, ssl.SSLError) as exc:
        return f"{seed.ondemand}: {exc}"
    took = (time.perf_counter() - started) * 1000
    say(
        f"  {seed.ondemand}: first connection on {host}:{port} served in {took:.0f} ms with a"
        f" certificate issued on demand by {info.issuer_cn} (serial {info.serial:x})"
    )
    return None


def run_seed(seed: Seed) -> int:
    token = seed.token_file.read_text().strip()
    ca = demo_ca(seed)
    failures: list[str] = []
    say(f"uploading {len(seed.names)} certificates through {seed.api} (demo CA: {seed.demo_ca})")
    for name in seed.names:
        chain, key = issue(ca, name, key=make_key("ec"))
        try:
            record = upload(seed, token, chain, key)
        except (OSError, RuntimeError) as exc:
            failures.append(str(exc))
            continue
        say(f"  {name}: stored as {record.get('id')}")
    for name in seed.names:
        failures += wait_served(seed, name, seed.demo_ca)
    say(f"on demand: {seed.ondemand} is in no store; its first connection orders it from pebble")
    problem = first_connection(seed)
    if problem is not None:
        failures.append(f"on demand: {problem}")
    if failures:
        for failure in failures:
            say(f"FAILED: {failure}")
        return 1
    say("done: the demo CA and pebble's root are in `docker-compose run --rm -T seed roots`")
    return 0


def print_roots(seed: Seed, write: Callable[[bytes], object]) -> int:
    if not seed.demo_ca.exists():
        say("no demo CA yet: the seed container has not run (docker-compose up first)")
        return 1
    write(seed.demo_ca.read_bytes())
    write(pebble_root(seed))
    return 0


def main(argv: list[str]) -> int:
    seed = Seed.from_env(dict(os.environ))
    if argv == ["roots"]:
        return print_roots(seed, sys.stdout.buffer.write)
    if argv:
        say(f"unknown arguments {argv}: none (seed) or 'roots'")
        return 2
    return run_seed(seed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
