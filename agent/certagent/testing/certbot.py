"""Certbot's on-disk layout, for tests and benchmarks of the directory store.

``/etc/letsencrypt`` as certbot leaves it::

    archive/<lineage>/{cert,chain,fullchain,privkey}<N>.pem   every version, kept
    live/<lineage>/{cert,chain,fullchain,privkey}.pem         symlinks to the current version
    renewal/<lineage>.conf

:func:`renew` writes version N+1 into ``archive/`` and re-points the four
``live/`` symlinks the way certbot does (``unlink`` then ``symlink``, one
after the other: not atomic).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from certagent.testing.certs import CA, cert_pem, issue_cert, key_pem, shared_key

__all__ = ["KINDS", "make_lineages", "renew", "version_of", "write_lineage"]

#: The order certbot re-points the links in (``storage.ALL_FOUR``).
KINDS = ("cert", "privkey", "chain", "fullchain")


def write_lineage(root: Path, lineage: str, chain: bytes, key: bytes) -> Path:
    """A new lineage at version 1 (``chain``: leaf + intermediates); returns ``live/<lineage>``."""
    (root / "archive" / lineage).mkdir(parents=True)
    (root / "live" / lineage).mkdir(parents=True)
    (root / "renewal").mkdir(exist_ok=True)
    _write_version(root, lineage, 1, chain, key)
    for kind in KINDS:
        os.symlink(f"../../archive/{lineage}/{kind}1.pem", root / "live" / lineage / f"{kind}.pem")
    (root / "renewal" / f"{lineage}.conf").write_text(
        f"archive_dir = {root / 'archive' / lineage}\nversion = 1\n"
    )
    return root / "live" / lineage


def version_of(root: Path, lineage: str) -> int:
    """The version ``live/<lineage>/fullchain.pem`` points to."""
    target = os.readlink(root / "live" / lineage / "fullchain.pem")
    found = re.search(r"fullchain(\d+)\.pem\Z", target)
    if found is None:
        raise ValueError(f"{target!r} is not a certbot archive file")
    return int(found.group(1))


def renew(root: Path, lineage: str, chain: bytes, key: bytes, *, pause: float = 0.0) -> int:
    """Certbot's renewal: archive files for version N+1, then the ``live/`` links re-pointed.

    ``pause`` s between two links (certbot does them back to back).  Returns N+1.
    """
    version = version_of(root, lineage) + 1
    _write_version(root, lineage, version, chain, key)
    live = root / "live" / lineage
    for kind in KINDS:
        link = live / f"{kind}.pem"
        os.unlink(link)
        os.symlink(f"../../archive/{lineage}/{kind}{version}.pem", link)
        if pause:
            time.sleep(pause)
    return version


def _write_version(root: Path, lineage: str, version: int, chain: bytes, key: bytes) -> None:
    archive = root / "archive" / lineage
    end = chain.index(b"-----END CERTIFICATE-----") + len(b"-----END CERTIFICATE-----\n")
    files = {
        "cert": chain[:end],
        "chain": chain[end:],
        "fullchain": chain,
        "privkey": key,
    }
    for kind, data in files.items():
        path = archive / f"{kind}{version}.pem"
        mode = 0o600 if kind == "privkey" else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)


def make_lineages(ca: CA, root: Path, count: int, domain: str = "le.test") -> Iterator[str]:
    """``count`` lineages ``s000000.<domain>`` ... with SANs apex + ``www.``; yields each name.

    One shared ECDSA key (see :func:`~certagent.testing.certs.shared_key`):
    about 0.4 ms per lineage, 20,000 in about 9 s.
    """
    key = key_pem(shared_key())
    intermediates = b"".join(cert_pem(c) for c in ca.chain)
    for i in range(count):
        name = f"s{i:06d}.{domain}"
        leaf = cert_pem(issue_cert(ca, name, f"www.{name}", key=shared_key()))
        write_lineage(root, name, leaf + intermediates, key)
        yield name
