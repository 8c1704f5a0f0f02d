"""The CPU side of ``cert import`` into Redis: read, validate and encode a batch of files.

:func:`prepare_batch` runs in worker processes (``concurrent.futures``): it is a
plain function of a picklable :class:`BatchJob` and returns, for each file, the
record to write (its key already encrypted) or the error that refused it.  Keys
never leave the worker in plaintext.  Every check of
:func:`~certagent.certs.validate.validate_upload` runs on every file; RSA keys
are proven by signing (``rsa_key_check="sign"``) rather than by OpenSSL's full
key check, ≈50x cheaper for RSA-2048 (docs/store.md, bulk adds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from certagent.certs.validate import UploadPolicy, validate_upload
from certagent.errors import AgentError, CertificateError, ConfigError
from certagent.store.base import PreparedRecord, RecordEncoder

__all__ = ["MAX_FILE", "BatchJob", "ImportItem", "prepare_batch", "read_file", "read_key"]

MAX_FILE = 1 << 20


@dataclass(frozen=True)
class ImportItem:
    label: str  # what the reports call it: the path, relative to the import root
    chain: Path
    key: Path | None  # None: combined PEM


@dataclass(frozen=True)
class BatchJob:
    items: tuple[ImportItem, ...]
    policy: UploadPolicy
    encoder: RecordEncoder
    now: datetime  # validity is checked at this time
    updated_at: datetime  # the records' updated_at


def prepare_batch(job: BatchJob) -> list[PreparedRecord | AgentError]:
    """For each item, in order: the record to write, or why the file was refused."""
    out: list[PreparedRecord | AgentError] = []
    for item in job.items:
        try:
            chain = read_file(item.chain)
            key = read_key(item.key)
            bundle = validate_upload(
                chain, key, now=job.now, policy=job.policy, rsa_key_check="sign"
            )
            out.append(job.encoder.prepare(bundle, job.updated_at))
        except AgentError as exc:
            out.append(exc)
    return out


def read_file(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            # Ask for what the file holds: a read of MAX_FILE + 1 allocates 1 MiB each
            # time (~20 us of page faults per file); read on if it grew meanwhile.
            size = os.fstat(handle.fileno()).st_size
            data = handle.read(size + 1 if 0 < size <= MAX_FILE else MAX_FILE + 1)
            if len(data) > size:
                data += handle.read(MAX_FILE + 1 - len(data))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_FILE:
        raise CertificateError(f"{path} is over {MAX_FILE} bytes; it is not a certificate")
    return data


def read_key(path: Path | None) -> bytes | None:
    """A certbot ``privkey.pem``; None if there is none (the key may be in fullchain.pem)."""
    if path is None:
        return None
    try:
        return read_file(path)
    except ConfigError:
        if not path.exists():
            return None
        raise
