"""The CPU side of ``cert import`` into Redis: read, validate and encode a batch of files.

:func:`prepare_batch` runs in worker processes (``concurrent.futures``): it is a
plain function of a picklable :class:`BatchJob` and returns, for each file, the
record to write (its key already encrypted; into one Redis, the write's packed
bytes) or the error that refused it.  Keys
never leave the worker in plaintext.  Every check of
:func:`~certagent.certs.validate.validate_upload` runs on every file, through
an :class:`~certagent.certs.bulkcheck.UploadChecker` kept by each worker (an
intermediate shared by many files is parsed and verified once); RSA keys
are proven by signing (``rsa_key_check="sign"``) rather than by OpenSSL's full
key check, ≈50x cheaper for RSA-2048 (docs/store.md, bulk adds).
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from certagent.certs.bulkcheck import UploadChecker
from certagent.certs.validate import UploadPolicy
from certagent.errors import AgentError, CertificateError, ConfigError
from certagent.store.base import PreparedRecord, RecordEncoder, WireRecord

__all__ = [
    "AHEAD",
    "MAX_FILE",
    "BatchJob",
    "ImportItem",
    "batch_files",
    "open_ahead",
    "prepare_batch",
    "read_file",
    "read_key",
]

MAX_FILE = 1 << 20
#: At most this many files of a batch are held open by :func:`open_ahead` (far below the
#: usual 1,024 descriptors a process may hold, whatever the batch's size).
AHEAD = 400


@dataclass(frozen=True)
class ImportItem:
    label: str  # what the reports call it: the path, relative to the import root
    chain: Path | str  # a combined file: the directory listing's text, no Path made
    key: Path | str | None  # None: combined PEM


@dataclass(frozen=True)
class BatchJob:
    #: Each item's (chain, key or None) paths, as text: a Path costs ≈5 µs to pickle and back.
    files: tuple[tuple[str, str | None], ...]
    policy: UploadPolicy
    encoder: RecordEncoder
    now: datetime  # validity is checked at this time
    updated_at: datetime  # the records' updated_at


def batch_files(items: tuple[ImportItem, ...]) -> tuple[tuple[str, str | None], ...]:
    """``items`` as :attr:`BatchJob.files`."""
    return tuple((str(i.chain), str(i.key) if i.key else None) for i in items)


def prepare_batch(job: BatchJob) -> list[PreparedRecord | WireRecord | AgentError]:
    """For each item, in order: the record to write, or why the file was refused.

    The record in the cheapest form the store takes (:meth:`RecordEncoder.encode
    <certagent.store.base.RecordEncoder.encode>`): into one Redis, the write
    itself, packed, so the importing process only sends bytes.
    """
    out: list[PreparedRecord | WireRecord | AgentError] = []
    checker = _checker(job.policy)
    opened = open_ahead(job.files)
    try:
        for (chain_path, key_path), (chain_fd, key_fd) in zip(job.files, opened, strict=True):
            try:
                chain = read_file(chain_path, chain_fd)
                key = read_key(key_path, key_fd)
                bundle = checker.validate(chain, key, now=job.now)
                out.append(job.encoder.encode(bundle, job.updated_at))
            except AgentError as exc:
                out.append(exc)
    finally:
        for fds in opened:
            for fd in fds:
                if fd is not None:
                    os.close(fd)
    return out


def open_ahead(files: tuple[tuple[str, str | None], ...]) -> list[tuple[int | None, int | None]]:
    """Open a batch's files and ask the kernel for all of them at once (``WILLNEED``).

    A one-off import reads each file once, from disk.  Read one at a time,
    each waits for its block: ≈65 µs per file here, 29 of them CPU in the
    kernel.  Asked for together, the reads go out as one queue and cost ≈13 µs
    per file, 11 in the kernel.  For files already cached this costs nothing
    more: the reads use these descriptors (the caller closes them).  A file
    that cannot be opened here gets None: its own read reports why.  Past
    :data:`AHEAD` descriptors, files get None and are read one at a time.
    """
    opened: list[tuple[int | None, int | None]] = []
    for chain_path, key_path in files:
        if 2 * len(opened) >= AHEAD:  # the rest are read one at a time
            opened.append((None, None))
        else:
            opened.append((_open_for_reading(chain_path), _open_for_reading(key_path)))
    return opened


def _open_for_reading(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # read_file opens it again and says why it cannot
    # only advice (refused for what is not a regular file): the read works without it
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    return fd


@functools.lru_cache(maxsize=4)
def _checker(policy: UploadPolicy) -> UploadChecker:
    """This process's checker for ``policy``: kept from batch to batch for its caches."""
    return UploadChecker(policy, rsa_key_check="sign")


def read_file(path: Path | str, fd: int | None = None) -> bytes:
    """The whole file (CertificateError past :data:`MAX_FILE` bytes; ConfigError if unreadable).

    With os-level calls: a file object costs ≈9 µs more per file, ≈5 % of a worker's time.
    ``fd``: the file, opened already (by :func:`open_ahead`; left open, the caller's).
    """
    if fd is not None:
        return _read_whole(path, fd)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return _read_whole(path, fd)
    finally:
        os.close(fd)


def _read_whole(path: Path | str, fd: int) -> bytes:
    try:
        # Ask for what the file holds: a read of MAX_FILE + 1 allocates 1 MiB each
        # time (~20 us of page faults per file); read on if it grew meanwhile.
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1 if 0 < size <= MAX_FILE else MAX_FILE + 1)
        if len(data) > size:
            parts, total = [data], len(data)
            while total <= MAX_FILE and (more := os.read(fd, MAX_FILE + 1 - total)):
                parts.append(more)
                total += len(more)
            data = b"".join(parts)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_FILE:
        raise CertificateError(f"{path} is over {MAX_FILE} bytes; it is not a certificate")
    return data


def read_key(path: Path | str | None, fd: int | None = None) -> bytes | None:
    """A certbot ``privkey.pem``; None if there is none (the key may be in fullchain.pem)."""
    if path is None:
        return None
    try:
        return read_file(path, fd)
    except ConfigError:
        if not os.path.exists(path):
            return None
        raise
