"""The bench's certificates: N ECDSA P-256 leaves, each with its own key, one intermediate.

Made once per ``(N, seed)`` into a cache outside the checkout and reused::

    <cache>/<N>-<seed>/root.pem          the test root (clients trust it)
    <cache>/<N>-<seed>/certs/<host>.pem  leaf + intermediate + PKCS#8 key, one file each
    <cache>/<N>-<seed>/.complete         written last: the set is whole

One combined PEM file per certificate in one flat directory is what ``certagent
cert import`` reads most cheaply (one read per file, no lineage lookups).  The
leaves are issued over every CPU (forked workers, ≈165 µs of CPU per leaf: 27 µs
for the key, 127 µs for the certificate); ``seed`` labels the set and derives
the serial numbers.  A smaller N of the same run is a directory of hard links
to the first N files (:func:`subset`), so both sizes hold the same certificates.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certagent.testing.certs import cert_pem, key_pem, make_ca

DEFAULT_CACHE = Path("/var/cache/certagent/bench")
DOMAIN = "million.test"
#: Leaves are valid this many days from generation; a set older than MAX_AGE_DAYS is remade.
VALID_DAYS = 90
MAX_AGE_DAYS = 60
CHUNK = 2_000
MARKER = ".complete"


def host(i: int) -> str:
    """The ``i``-th certificate's name: ``h0000042.million.test``."""
    return f"h{i:07d}.{DOMAIN}"


@dataclass(frozen=True)
class CertSet:
    """A generated set: where it is, how many, whether this run made it and in how long."""

    directory: Path  # the combined PEM files
    root: Path  # the CA root clients trust
    count: int
    from_cache: bool
    generate_s: float | None  # None: from the cache (its own generation time is in ``made``)
    made: dict[str, object]


def _leaf_range(args: tuple[Path, bytes, bytes, bytes, int, int, int]) -> int:
    """Write leaves ``start .. stop - 1`` (one fork worker's share)."""
    directory, issuer_pem, issuer_key_pem, chain_tail, seed, start, stop = args
    issuer = x509.load_pem_x509_certificate(issuer_pem)
    issuer_key = serialization.load_pem_private_key(issuer_key_pem, None)
    assert isinstance(issuer_key, ec.EllipticCurvePrivateKey)
    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(hours=1), now + dt.timedelta(days=VALID_DAYS)
    extensions: list[tuple[x509.ExtensionType, bool]] = [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            True,
        ),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False),
    ]
    serials = random.Random(f"{seed}:{start}")
    for i in range(start, stop):
        name = host(i)
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer.subject)
            .public_key(key.public_key())
            .serial_number(serials.getrandbits(120) | 1 << 120)
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), False)
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical)
        leaf = builder.sign(issuer_key, hashes.SHA256())
        data = cert_pem(leaf) + chain_tail + key_pem(key)
        fd = os.open(directory / f"{name}.pem", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return stop - start


def _worker_init() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the pool ends its workers so; not a stop


def _usable(base: Path, count: int) -> dict[str, object] | None:
    """The marker's record if ``base`` holds a whole, young enough set of ``count``."""
    try:
        made: dict[str, object] = json.loads((base / MARKER).read_text())
    except (OSError, ValueError):
        return None
    created = made.get("created_unix")
    young = isinstance(created, int | float) and time.time() - created < MAX_AGE_DAYS * 86400
    return made if made.get("count") == count and young else None


def generated(cache: Path, count: int, seed: int, say: object = None) -> CertSet:
    """The set of ``count`` for ``seed`` in ``cache``: reused when whole, else made now."""
    base = cache / f"{count}-{seed}"
    directory, root = base / "certs", base / "root.pem"
    made = _usable(base, count)
    if made is not None:
        return CertSet(directory, root, count, True, None, made)
    shutil.rmtree(base, ignore_errors=True)
    directory.mkdir(parents=True)
    started = time.monotonic()
    ca = make_ca("certagent million bench CA")
    root.write_bytes(ca.root_pem)
    jobs = [
        (directory, cert_pem(ca.cert), key_pem(ca.key), ca.chain_pem, seed, first,
         min(count, first + CHUNK))
        for first in range(0, count, CHUNK)
    ]  # fmt: skip
    done = 0
    with multiprocessing.get_context("fork").Pool(os.cpu_count() or 1, _worker_init) as pool:
        for n in pool.imap_unordered(_leaf_range, jobs):
            done += n
            if callable(say) and done % 100_000 < CHUNK:
                say(f"million: generated {done:,} of {count:,}")
    seconds = time.monotonic() - started
    made = {
        "count": count,
        "seed": seed,
        "created_unix": int(time.time()),
        "generate_s": round(seconds, 1),
        "workers": os.cpu_count(),
        "key": "ECDSA P-256, one per certificate",
    }
    (base / MARKER).write_text(json.dumps(made) + "\n")  # last: the set is whole
    return CertSet(directory, root, count, False, seconds, made)


def subset(full: CertSet, count: int) -> Path:
    """A directory of hard links to ``full``'s first ``count`` files (made once, kept)."""
    if count >= full.count:
        return full.directory
    target = full.directory.parent / f"first-{count}"
    marker = target / MARKER
    if marker.exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    for i in range(count):
        name = f"{host(i)}.pem"
        os.link(full.directory / name, target / name)
    marker.write_text(f"{count}\n")
    return target
