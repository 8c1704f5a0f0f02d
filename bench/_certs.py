"""Many test certificates, fast: one CA, one leaf key shared by every leaf.

Issuing a leaf costs one signature by the CA (≈0.15 ms ECDSA, ≈0.6 ms RSA);
the key pair is made once.  The first bundle goes through the agent's full
``parse_bundle`` validation; the others are copies of it with the leaf's own
certificate, names, fingerprints, serial and dates (``parse_bundle`` would
re-load and re-check the same key 100,000 times).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from certagent.certs.pem import CertBundle, parse_bundle
from certagent.testing import PKI
from certagent.testing.certs import KeyType, cert_pem, issue_cert, key_pem, shared_key

DOMAIN = "bench.test"


def host(i: int) -> str:
    return f"h{i:06d}.{DOMAIN}"


class Leaves:
    """Leaf certificates for ``host(0) .. host(count - 1)``, issued on demand."""

    def __init__(self, pki: PKI) -> None:
        self.pki = pki
        self.key_type: KeyType = pki.key_type
        self.key_pem = key_pem(shared_key(pki.key_type))
        self._template: CertBundle | None = None

    def chain(self, name: str) -> tuple[bytes, bytes]:
        """``(chain PEM, leaf DER)`` for ``name``: leaf then intermediate."""
        cert = issue_cert(self.pki.ca, name, key=shared_key(self.key_type))
        return cert_pem(cert) + self.pki.ca.chain_pem, cert.public_bytes(serialization.Encoding.DER)

    def bundle(self, name: str) -> CertBundle:
        cert = issue_cert(self.pki.ca, name, key=shared_key(self.key_type))
        chain = cert_pem(cert) + self.pki.ca.chain_pem
        if self._template is None:
            self._template = parse_bundle(chain, self.key_pem)
            return self._template
        der = cert.public_bytes(serialization.Encoding.DER)
        return dataclasses.replace(
            self._template,
            pem=chain + self.key_pem,
            names=(name,),
            fingerprint_sha1=hashlib.sha1(der, usedforsecurity=False).hexdigest().upper(),
            fingerprint_sha256=hashlib.sha256(der).hexdigest(),
            serial=cert.serial_number,
            not_before=cert.not_valid_before_utc,
            not_after=cert.not_valid_after_utc,
        )


def write_preload_files(
    leaves: Leaves, names: Sequence[str], directory: Path, bundles: bool = True
) -> Iterator[CertBundle]:
    """Write ``directory/<name>.pem`` (chain + key) for each name; yield the bundles too."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        bundle = leaves.bundle(name)
        (directory / f"{name}.pem").write_bytes(bundle.pem)
        if bundles:
            yield bundle


def write_crt_list(path: Path, directory: Path, names: Sequence[str]) -> Path:
    """A crt-list with one line per certificate file (no SNI filters: names come from SANs)."""
    with open(path, "w") as fh:
        for name in names:
            fh.write(f"{directory / name}.pem\n")
    return path
