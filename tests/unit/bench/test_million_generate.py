"""bench.million.generate: a set made once, each leaf with its own key, reused, subsets."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bench.million.generate import MARKER, generated, host, subset


def test_a_set_is_made_once_with_a_key_per_leaf_and_then_reused(tmp_path: Path) -> None:
    made = generated(tmp_path, 12, 7)
    assert not made.from_cache and made.generate_s is not None
    files = sorted(made.directory.iterdir())
    assert [f.name for f in files] == [f"{host(i)}.pem" for i in range(12)]
    keys = set()
    for f in files[:3]:
        data = f.read_bytes()
        leaf, intermediate = x509.load_pem_x509_certificates(data)
        assert leaf.issuer == intermediate.subject
        key = serialization.load_pem_private_key(data[data.index(b"-----BEGIN PRIVATE") :], None)
        assert key.public_key() == leaf.public_key()
        keys.add(key.public_key().public_numbers().x)  # type: ignore[union-attr]
    assert len(keys) == 3  # a key of its own each
    assert (made.directory.parent / MARKER).exists()

    again = generated(tmp_path, 12, 7)
    assert again.from_cache and again.generate_s is None and again.made == made.made

    first = subset(made, 5)
    assert sorted(p.name for p in first.iterdir() if p.suffix == ".pem") == [
        f"{host(i)}.pem" for i in range(5)
    ]
    assert (first / f"{host(0)}.pem").stat().st_ino == (files[0]).stat().st_ino
    assert subset(made, 12) == made.directory


def test_an_unfinished_set_is_made_again(tmp_path: Path) -> None:
    made = generated(tmp_path, 4, 1)
    (made.directory.parent / MARKER).unlink()
    assert not generated(tmp_path, 4, 1).from_cache
