"""Certificates for the pool, and the payload forms of one load that q2 compares."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certagent.testing import PKI
from certagent.testing.certs import (
    CA,
    Key,
    KeyType,
    cert_pem,
    issue,
    issue_cert,
    key_pem,
    make_ca,
    make_ca_path,
    shared_key,
)

#: The host of the ``ec-leafonly-issuers`` variant (a leaf of the pool CA, sent alone).
ISSUERS_HOST = "q2-issuers.test"
#: The payload every variant is compared with: what the agent sends.
AGENT_FORM = "ec-pkcs8-last"

EC_PARAMS_P256 = (
    b"-----BEGIN EC PARAMETERS-----\n"
    + base64.b64encode(bytes.fromhex("06082a8648ce3d030107"))
    + b"\n-----END EC PARAMETERS-----\n"
)


class Certs:
    """Leaves for the pool (EC P-256, one shared key, one name each) and the q2 variants."""

    def __init__(self, workdir: Path) -> None:
        self.pki = PKI.create(workdir / "ca.pem", name="profile_load CA")
        self.ca: CA = self.pki.ca
        self.ec_key: Key = shared_key("ec")

    def pem(self, host: str, key_type: KeyType = "ec") -> bytes:
        """Leaf, intermediate, key (PKCS#8, last): the agent's form."""
        chain, key = issue(self.ca, host, key=shared_key(key_type))
        return chain + key

    def pem_and_der(self, host: str, key_type: KeyType = "ec") -> tuple[bytes, bytes]:
        """:meth:`pem` and the leaf's DER, to recognise it in a handshake."""
        key = shared_key(key_type)
        cert = issue_cert(self.ca, host, key=key)
        der = cert.public_bytes(serialization.Encoding.DER)
        return cert_pem(cert) + self.ca.chain_pem + key_pem(key), der


def _der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _tlv(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _der_len(len(body)) + body


def ec_pkcs8_without_public_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PKCS#8 P-256 key whose inner ECPrivateKey has neither parameters nor public key.

    Some tools write this form; OpenSSL must then derive the public point (a scalar
    multiplication) when it loads the key.
    """
    d = key.private_numbers().private_value.to_bytes(32, "big")
    inner = _tlv(0x30, _tlv(0x02, b"\x01") + _tlv(0x04, d))
    algid = _tlv(
        0x30,
        _tlv(0x06, bytes.fromhex("2a8648ce3d0201")) + _tlv(0x06, bytes.fromhex("2a8648ce3d030107")),
    )
    der = _tlv(0x30, _tlv(0x02, b"\x00") + algid + _tlv(0x04, inner))
    b64 = base64.encodebytes(der).replace(b"\n", b"")
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    pem = b"-----BEGIN PRIVATE KEY-----\n" + b"\n".join(lines) + b"\n-----END PRIVATE KEY-----\n"
    loaded = serialization.load_pem_private_key(pem, None)
    assert loaded.private_numbers() == key.private_numbers()  # type: ignore[union-attr]
    return pem


def payload_variants(certs: Certs) -> dict[str, dict[str, Any]]:
    """Payload variants of one load: key encoding, chain length, block order.

    ``ec-leafonly-issuers`` is a leaf of the pool CA without its intermediate: HAProxy
    attaches the intermediate from ``issuers-chain-path`` (checked with a verified handshake).
    """
    one_inter = make_ca("q2 CA")
    two_inters = make_ca_path(2, "q2 deep CA")
    no_inter = make_ca("q2 flat CA", intermediate=False)
    ec_key = shared_key("ec")
    rsa_key = shared_key("rsa")
    assert isinstance(ec_key, ec.EllipticCurvePrivateKey)
    ec_leaf = cert_pem(issue_cert(one_inter, "q2-ec.test", key=ec_key))
    rsa_leaf = cert_pem(issue_cert(one_inter, "q2-rsa.test", key=rsa_key))
    ec_leaf_deep = cert_pem(issue_cert(two_inters, "q2-ec2.test", key=ec_key))
    ec_leaf_flat = cert_pem(issue_cert(no_inter, "q2-ec0.test", key=ec_key))
    ec_leaf_pool = cert_pem(issue_cert(certs.ca, ISSUERS_HOST, key=ec_key))
    ec_p8 = key_pem(ec_key, "pkcs8")
    ec_sec1 = key_pem(ec_key, "traditional")
    ec_p8_nopub = ec_pkcs8_without_public_key(ec_key)
    rsa_p8 = key_pem(rsa_key, "pkcs8")
    rsa_p1 = key_pem(rsa_key, "traditional")
    assert ec_p8.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert ec_sec1.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    assert rsa_p1.startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    ec_chain = ec_leaf + one_inter.chain_pem
    rsa_chain = rsa_leaf + one_inter.chain_pem
    deep_chain = ec_leaf_deep + two_inters.chain_pem
    forms: dict[str, tuple[str, bytes]] = {
        # name: (what, payload)
        AGENT_FORM: (
            "ECDSA P-256, PKCS#8 'PRIVATE KEY', leaf+1 inter, key last (agent today)",
            ec_chain + ec_p8,
        ),
        "ec-pkcs8-first": ("ECDSA P-256, PKCS#8, leaf+1 inter, key first", ec_p8 + ec_chain),
        "ec-sec1-last": ("ECDSA P-256, SEC1 'EC PRIVATE KEY', key last", ec_chain + ec_sec1),
        "ec-sec1-first": ("ECDSA P-256, SEC1, key first", ec_sec1 + ec_chain),
        "ec-params-sec1-last": (
            "ECDSA P-256, 'EC PARAMETERS' + SEC1, key last",
            ec_chain + EC_PARAMS_P256 + ec_sec1,
        ),
        "ec-params-sec1-first": (
            "ECDSA P-256, 'EC PARAMETERS' + SEC1, key first",
            EC_PARAMS_P256 + ec_sec1 + ec_chain,
        ),
        "ec-pkcs8-nopub-last": (
            "ECDSA P-256, PKCS#8 without public key, key last",
            ec_chain + ec_p8_nopub,
        ),
        "rsa-pkcs8-last": ("RSA-2048, PKCS#8 'PRIVATE KEY', key last", rsa_chain + rsa_p8),
        "rsa-pkcs8-first": ("RSA-2048, PKCS#8, key first", rsa_p8 + rsa_chain),
        "rsa-pkcs1-last": ("RSA-2048, PKCS#1 'RSA PRIVATE KEY', key last", rsa_chain + rsa_p1),
        "rsa-pkcs1-first": ("RSA-2048, PKCS#1, key first", rsa_p1 + rsa_chain),
        "ec-chain0-last": ("ECDSA P-256, PKCS#8, leaf only, key last", ec_leaf_flat + ec_p8),
        "ec-chain2-last": ("ECDSA P-256, PKCS#8, leaf+2 inters, key last", deep_chain + ec_p8),
        "ec-chain2-first": ("ECDSA P-256, PKCS#8, leaf+2 inters, key first", ec_p8 + deep_chain),
        "ec-leafonly-issuers": (
            "ECDSA P-256, PKCS#8, leaf only, intermediate from issuers-chain-path",
            ec_leaf_pool + ec_p8,
        ),
    }
    return {
        name: {"what": what, "payload": payload, "bytes": len(payload)}
        for name, (what, payload) in forms.items()
    }
