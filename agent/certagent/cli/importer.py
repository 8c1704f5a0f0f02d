"""``certagent cert import``: a directory of PEM files or certbot lineages, into the store.

Two ways in: into Redis directly, files are validated and encoded in batches by
worker processes (:mod:`certagent.cli._import_work`) and each batch is written in
one round trip (:meth:`Store.bulk <certagent.store.base.Store.bulk>`);
otherwise (a directory store, the REST API) files are added one by one, ``jobs``
at a time.  Cost: O(files) CPU for validation, O(files / batch) round trips;
memory: the batches in flight (files are listed as they are imported).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import BrokenExecutor, Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from certagent.api.client import ApiProblem, ApiUnreachable
from certagent.api.problems import AlreadyStored
from certagent.cli._import_work import (
    BatchJob,
    ImportItem,
    batch_files,
    prepare_batch,
    read_file,
    read_key,
)
from certagent.cli.backends import Backend, StoreBackend
from certagent.cli.progress import Progress
from certagent.errors import (
    AgentError,
    ConfigError,
    DuplicateCertificate,
    StoreError,
    StoreUnavailable,
)
from certagent.store.base import (
    AddAlone,
    BulkResult,
    BulkWriter,
    CertRecord,
    IdTaken,
    PreparedRecord,
    WireRecord,
    WireResult,
)

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_JOBS",
    "DEFAULT_WORKERS",
    "ImportItem",
    "ImportResult",
    "count_import_items",
    "find_import_items",
    "import_certificates",
    "iter_import_items",
]

DEFAULT_JOBS = 8
#: Files per batch: validated by one worker, written in one Redis round trip.
DEFAULT_BATCH = 200
#: Validation processes: one per CPU.
DEFAULT_WORKERS = os.cpu_count() or 1
#: Fewer files than this are validated in the importing process: a pool takes ≈0.5 s to start.
POOL_FROM = 1000

#: What a worker gives for one file: the record to write, or why the file was refused.
_Outcome = PreparedRecord | WireRecord | AgentError


@dataclass
class ImportResult:
    total: int = 0
    added: int = 0
    existing: int = 0
    failed: int = 0
    seconds: float = 0.0
    stopped: str | None = None  # why the import stopped early (store or API unavailable)

    @property
    def done(self) -> int:
        return self.added + self.existing + self.failed

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        text = (
            f"imported {self.done} of {self.total} files in {self.seconds:.1f} s"
            f" ({self.rate:.0f}/s): {self.added} added, {self.existing} already stored,"
            f" {self.failed} failed"
        )
        return text + (f"; stopped: {self.stopped}" if self.stopped else "")


def find_import_items(root: Path) -> list[ImportItem]:
    """Every item :func:`iter_import_items` yields, as a list (O(files) memory)."""
    return list(iter_import_items(root))


def iter_import_items(root: Path) -> Iterator[ImportItem]:
    """``root/*.pem`` (combined), then certbot lineages in ``root/live/*/`` and ``root/*/``.

    In directory order, as the directory is read: nothing is held but the entry
    at hand, so memory does not grow with the number of files (a sorted list
    of a million entries and their paths took ≈600 MB).  File types come from
    the listing (no stat per file); a lineage costs one stat of its fullchain.
    A combined file's path is the listing's text (a Path per file cost ≈10 µs
    of this process's CPU, a tenth of it).
    """
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory")
    for entry in _combined(root):
        yield ImportItem(entry.name, entry.path, None)
    yield from _lineages(root)


def count_import_items(root: Path) -> int:
    """How many items :func:`iter_import_items` yields now (one more pass, O(1) memory)."""
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory")
    return sum(1 for _ in _combined(root)) + sum(1 for _ in _lineages(root))


def _combined(root: Path) -> Iterator[os.DirEntry[str]]:
    """The entries of ``root``'s combined PEM files."""
    for entry in _entries(root):
        name = entry.name
        if name.endswith(".pem") and not name.startswith(".") and entry.is_file():
            yield entry


def _lineages(root: Path) -> Iterator[ImportItem]:
    """certbot lineages in ``root/live/*/`` and ``root/*/``."""
    live = root / "live"
    for base in (live, root) if live.is_dir() else (root,):
        for entry in _entries(base):
            if not entry.is_dir():
                continue
            lineage = base / entry.name
            fullchain = lineage / "fullchain.pem"
            if fullchain.is_file():
                label = str(fullchain.relative_to(root))
                yield ImportItem(label, fullchain, lineage / "privkey.pem")


def _entries(directory: Path) -> Iterator[os.DirEntry[str]]:
    """The entries of ``directory``, in directory order, one at a time."""
    try:
        with os.scandir(directory) as found:
            yield from found
    except OSError as exc:
        raise ConfigError(f"cannot list {directory}: {exc.strerror}") from exc


async def import_certificates(
    backend: Backend,
    root: Path,
    *,
    jobs: int = DEFAULT_JOBS,
    workers: int = DEFAULT_WORKERS,
    batch: int = DEFAULT_BATCH,
    progress: TextIO | Progress | None = None,
) -> ImportResult:
    """Add every certificate :func:`find_import_items` finds under ``root``.

    Into Redis: ``batch`` files at a time, validated by ``workers`` processes
    (0: in this process); otherwise one by one, ``jobs`` at a time.  A file
    that cannot be read or is refused is reported on ``progress`` and skipped;
    one already stored is counted and skipped.  The import stops early only
    when the store or the API is unavailable (or refuses the token), or when
    the fleet's agents do not hold the data key it would encrypt with: into a
    store directly that is :class:`~certagent.errors.ForeignDataKey` before any
    write (one check for the whole import).
    ``progress``: where to show it (a bar on a terminal, else a line every few
    seconds), or a :class:`~certagent.cli.progress.Progress` of your own.
    """
    start = time.monotonic()
    result = ImportResult(total=count_import_items(root))
    if isinstance(backend, StoreBackend) and result.total:
        try:
            await backend.check_keys()  # ForeignDataKey: nothing is written
        except StoreUnavailable as exc:
            result.stopped = f"{exc}; nothing was stored: import again to finish"
            return result
    items = iter_import_items(root)
    shown = progress if isinstance(progress, Progress) else Progress(progress)
    shown.begin(result)
    if isinstance(backend, StoreBackend) and result.total and (bulk := backend.bulk()) is not None:
        if result.total < POOL_FROM:
            workers = 0
        await _import_in_batches(backend, bulk, items, result, shown, workers, max(1, batch))
    else:
        await _import_one_by_one(backend, items, result, shown, jobs)
    result.seconds = time.monotonic() - start
    shown.finish()
    return result


async def _import_one_by_one(
    backend: Backend, items: Iterator[ImportItem], result: ImportResult, shown: Progress, jobs: int
) -> None:
    slots = asyncio.Semaphore(max(1, jobs))
    pending: set[asyncio.Task[None]] = set()

    async def one(item: ImportItem) -> None:
        try:
            await _add_one(backend, item, result, shown)
        finally:
            slots.release()

    for item in items:
        await slots.acquire()
        if result.stopped:
            slots.release()
            break
        task = asyncio.create_task(one(item))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)


async def _add_one(
    backend: Backend, item: ImportItem, result: ImportResult, shown: Progress
) -> None:
    try:
        chain = await asyncio.to_thread(read_file, item.chain)
        key = await asyncio.to_thread(read_key, item.key) if item.key else None
        await backend.add(chain, key)
        result.added += 1
    except AgentError as exc:
        if _fatal(exc):
            result.stopped = result.stopped or str(exc)
        elif _already(exc):
            result.existing += 1
        else:
            result.failed += 1
            shown.report(item.label, exc)
    finally:
        shown.update()


# --- into Redis, in batches ------------------------------------------------------------------


async def _import_in_batches(
    backend: StoreBackend,
    bulk: BulkWriter,
    items: Iterator[ImportItem],
    result: ImportResult,
    shown: Progress,
    workers: int,
    batch: int,
) -> None:
    """Validate batches in ``workers`` processes, write each in one round trip as it comes.

    Up to two batches per worker are in the pool at once, so the workers
    validate while this process writes.  Results are taken in order.  Files
    are listed as batches are made: memory holds the batches in flight, not
    the whole directory.
    """
    encoder = await bulk.encoder()
    loop = asyncio.get_running_loop()
    batches = iter(lambda: tuple(itertools.islice(items, batch)), ())  # read as they go
    pending: deque[tuple[tuple[ImportItem, ...], asyncio.Future[list[_Outcome]]]] = deque()
    with _executor(workers) as pool:

        def submit() -> None:
            chunk = next(batches, None)
            if chunk is not None:
                now = backend.now()
                files = batch_files(chunk)
                job = BatchJob(files, backend.policy, encoder, now, now.replace(microsecond=0))
                pending.append((chunk, loop.run_in_executor(pool, prepare_batch, job)))

        try:
            for _ in range(2 * max(1, workers)):
                submit()
            while pending and not result.stopped:
                chunk, future = pending.popleft()
                outcomes = await future
                submit()
                await _write_batch(backend, bulk, chunk, outcomes, result, shown)
        except BrokenExecutor as exc:
            result.stopped = f"a validation worker process died ({type(exc).__name__}: {exc})"
        finally:
            for _, future in pending:
                future.cancel()


async def _write_batch(
    backend: StoreBackend,
    bulk: BulkWriter,
    chunk: tuple[ImportItem, ...],
    outcomes: list[_Outcome],
    result: ImportResult,
    shown: Progress,
) -> None:
    prepared = [outcome for outcome in outcomes if isinstance(outcome, PreparedRecord)]
    packed = [outcome for outcome in outcomes if isinstance(outcome, WireRecord)]
    try:
        written_prepared = iter(await bulk.add_prepared(prepared) if prepared else [])
        written_packed = iter(await bulk.add_wire(packed) if packed else [])
    except StoreUnavailable as exc:
        result.stopped = (
            f"{exc}; each record of the last batch is stored entirely or not at all:"
            " import again to finish (stored ones count as already stored)"
        )
        return
    except StoreError as exc:
        written_prepared = iter([exc] * len(prepared))
        written_packed = iter([exc] * len(packed))
    for item, outcome in zip(chunk, outcomes, strict=True):
        done: BulkResult | WireResult | AgentError
        if isinstance(outcome, PreparedRecord):
            done = next(written_prepared)
        elif isinstance(outcome, WireRecord):
            done = next(written_packed)
        else:
            done = outcome
        if isinstance(done, CertRecord | WireRecord):
            result.added += 1
        elif isinstance(done, DuplicateCertificate):
            result.existing += 1
        elif isinstance(done, IdTaken | AddAlone):
            # its random id was in use, or the batch cannot write it: add it on its own
            await _add_one(backend, item, result, shown)
            continue
        else:
            result.failed += 1
            shown.report(item.label, done)
        shown.update()


@contextmanager
def _executor(workers: int) -> Iterator[Executor]:
    """``workers`` processes (forkserver: no fork of a process running threads), or a thread."""
    pool: Executor
    if workers > 0:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([prepare_batch.__module__])  # imported once, not per worker
        pool = ProcessPoolExecutor(workers, mp_context=context)
    else:
        pool = ThreadPoolExecutor(1, thread_name_prefix="certagent-import")
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _already(exc: AgentError) -> bool:
    if isinstance(exc, ApiProblem):
        return exc.status == 409
    return isinstance(exc, AlreadyStored)


def _fatal(exc: AgentError) -> bool:
    if isinstance(exc, ApiProblem):
        return exc.status in (401, 403) or exc.status >= 500 or exc.code == "foreign-data-key"
    return isinstance(exc, StoreUnavailable | ApiUnreachable)
