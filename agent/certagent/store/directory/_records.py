"""The directory store's records: ids, metadata, and the agent's own writes.

Blocking methods, run on the store's worker threads by
:class:`~certagent.store.directory.DirectoryStore` (which adds the timeouts).
Paths are built only from ids checked by :meth:`Records.parse_id` or from
validated names, so they never leave root.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from certagent.certs.pem import CertBundle, parse_leaf
from certagent.errors import (
    CertificateError,
    DuplicateCertificate,
    NotFound,
    ReadOnlyRecord,
    StoreCorrupt,
    StoreUnavailable,
)
from certagent.store.base import CertRecord
from certagent.store.directory import _files
from certagent.store.directory._files import atomic_write, exclusive_write, fsync_dir, signature
from certagent.store.directory._index import FULLCHAIN, LIVE, file_stem, lineage_id, name_of_stem
from certagent.store.directory._scan import alias_target, list_live, list_root
from certagent.store.directory._state import drop_mark, read_mark, write_mark
from certagent.store.records import make_record

__all__ = ["Records", "spellings"]

log = logging.getLogger(__name__)


def spellings(name: str) -> list[str]:
    """The stems a lookup tries for ``name``, in order."""
    return [file_stem(name), name] if name.startswith("*.") else [name]


class Records:
    """Record-level operations on one root (worker threads)."""

    def __init__(self, root: Path, uri: str) -> None:
        self.root = root
        self.uri = uri

    # --- reading -----------------------------------------------------------------------

    def parse_id(self, cert_id: str) -> tuple[str, Path, bool] | None:
        """A record id as (name, chain path, certbot?); None if no record can have that id."""
        parts = cert_id.split("/")
        if len(parts) == 1 and cert_id.endswith(".pem"):
            name = name_of_stem(cert_id[:-4])
            return None if name is None else (name, self.root / cert_id, False)
        if len(parts) == 3 and parts[0] == LIVE and parts[2] == FULLCHAIN:
            name = name_of_stem(parts[1])
            return None if name is None else (name, self.root / cert_id, True)
        return None

    def get(self, cert_id: str) -> CertRecord | None:
        parsed = self.parse_id(cert_id)
        if parsed is None:
            return None
        _, path, certbot = parsed
        if not certbot and alias_target(self.root, cert_id) is not None:
            return None  # an alias, not a record
        return self.read_record(cert_id, path)

    def read_record(self, cert_id: str, path: Path) -> CertRecord | None:
        """The metadata of the record at ``path`` (its first certificate); None if absent.

        ``managed`` is its mark's (:mod:`._state`) if the mark is about this leaf.
        """
        try:
            data, mtime = _files.read_regular(path, f"{self.uri}: {cert_id!r}")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreUnavailable(f"{self.uri}: cannot read {cert_id!r}: {exc.strerror}") from exc
        try:
            info = parse_leaf(data)
        except CertificateError as exc:
            raise StoreCorrupt(f"{self.uri}: record {cert_id!r} is not valid: {exc}") from exc
        managed = "" if "/" in cert_id else read_mark(self.root, cert_id, info.fingerprint_sha256)
        return make_record(
            cert_id,
            info,
            version=1,
            updated_at=datetime.fromtimestamp(mtime, UTC),
            managed=managed,
        )

    def ids(self) -> list[str]:
        """Every record id (files that are not aliases, lineages with a fullchain.pem), sorted."""
        found = [
            filename
            for filename in list_root(self.root, self.uri)
            if alias_target(self.root, filename) is None
            and signature(self.root / filename) is not None
        ]
        found += [
            lineage_id(dirname)
            for dirname in list_live(self.root, self.uri, None)
            if signature(self.root / lineage_id(dirname)) is not None
        ]
        return sorted(found)

    def read_records(
        self, ids: Sequence[str], progress: list[str]
    ) -> list[CertRecord | StoreCorrupt | None]:
        """:meth:`read_record` of each id (a StoreCorrupt in its place if it is not valid)."""
        results: list[CertRecord | StoreCorrupt | None] = []
        for cert_id in ids:
            progress.append(cert_id)
            try:
                results.append(self.read_record(cert_id, self.root / cert_id))
            except StoreCorrupt as exc:
                results.append(exc)
        return results

    # --- writing -----------------------------------------------------------------------

    def holder(self, name: str) -> str | None:
        """The file or certbot directory a lookup for exactly ``name`` would find."""
        for stem in spellings(name):
            for relative in (f"{stem}.pem", f"{LIVE}/{stem}"):
                if os.path.lexists(self.root / relative):
                    return relative
        return None

    def add(self, bundle: CertBundle, managed: str = "") -> CertRecord:
        """Write ``<first name>.pem`` and its aliases; with ``managed``, its mark first.

        The mark (:mod:`._state`) goes first so that no reader sees the file
        without it; if the file cannot be written, the mark is taken back (only
        if it is still about this leaf: a concurrent writer's stays).
        """
        name = bundle.names[0]
        cert_id = f"{file_stem(name)}.pem"
        holder = self.holder(name)
        if holder is not None:
            raise self._duplicate(name, holder)
        try:
            if managed:
                write_mark(self.root, cert_id, managed, bundle.fingerprint_sha256)
            try:
                exclusive_write(self.root, cert_id, bundle.pem)
            except BaseException:
                if managed:
                    drop_mark(self.root, cert_id, bundle.fingerprint_sha256)
                raise
        except FileExistsError:
            raise self._duplicate(name, cert_id) from None
        except OSError as exc:
            raise StoreUnavailable(f"{self.uri}: cannot write {cert_id!r}: {exc.strerror}") from exc
        try:
            self._link_aliases(cert_id, [n for n in bundle.names if n != name])
            fsync_dir(self.root)
            mtime = os.stat(self.root / cert_id).st_mtime
        except OSError as exc:
            raise StoreUnavailable(f"{self.uri}: cannot write {cert_id!r}: {exc.strerror}") from exc
        return make_record(
            cert_id,
            bundle,
            version=1,
            updated_at=datetime.fromtimestamp(mtime, UTC),
            managed=managed,
        )

    def _duplicate(self, name: str, holder: str) -> DuplicateCertificate:
        return DuplicateCertificate(
            f"{self.uri}: a certificate for {name} is already stored as {holder!r};"
            " replace or delete that record instead"
        )

    def _writable(self, cert_id: str) -> tuple[str, Path]:
        """The name and path of the agent-writable record ``cert_id``, or raise."""
        parsed = self.parse_id(cert_id)
        if parsed is None:
            raise NotFound(f"{self.uri}: no certificate {cert_id[:100]!r}")
        name, path, certbot = parsed
        if certbot:
            raise ReadOnlyRecord(
                f"{self.uri}: {cert_id!r} belongs to certbot; renew or remove it with certbot"
            )
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            raise NotFound(f"{self.uri}: no certificate {cert_id!r}") from None
        except OSError as exc:
            raise StoreUnavailable(f"{self.uri}: cannot read {cert_id!r}: {exc.strerror}") from exc
        if stat.S_ISLNK(mode):
            target = alias_target(self.root, cert_id)
            if target is not None:
                raise NotFound(f"{self.uri}: {cert_id!r} is an alias of certificate {target!r}")
            raise ReadOnlyRecord(
                f"{self.uri}: {cert_id!r} is a symlink the agent did not make; change its target"
            )
        if not stat.S_ISREG(mode):
            raise NotFound(f"{self.uri}: no certificate {cert_id!r}")
        return name, path

    def replace(self, cert_id: str, bundle: CertBundle) -> tuple[CertRecord, set[str]]:
        """Rewrite ``cert_id``; the record and the alias files removed.

        An upload replacing an issued record takes it over: its mark goes.
        """
        name, _ = self._writable(cert_id)
        if name not in bundle.names:
            raise CertificateError(
                f"the new certificate does not cover {name}, the name {cert_id!r} is stored"
                f" under (it covers {' '.join(bundle.names)}): add it as a new certificate"
            )
        removed: set[str] = set()
        try:
            atomic_write(self.root, cert_id, bundle.pem)
            drop_mark(self.root, cert_id)
            aliases = self.aliases_of(cert_id)
            for alias_name, alias in aliases.items():
                if alias_name not in bundle.names:
                    os.unlink(self.root / alias)
                    removed.add(alias)
            self._link_aliases(
                cert_id, [n for n in bundle.names if n != name and n not in aliases]
            )
            fsync_dir(self.root)
            mtime = os.stat(self.root / cert_id).st_mtime
        except OSError as exc:
            raise StoreUnavailable(f"{self.uri}: cannot write {cert_id!r}: {exc.strerror}") from exc
        record = make_record(
            cert_id, bundle, version=1, updated_at=datetime.fromtimestamp(mtime, UTC)
        )
        return record, removed

    def delete(self, cert_id: str) -> tuple[CertRecord, set[str]]:
        """Remove ``cert_id`` and its aliases; what it was, and the alias files removed."""
        _, path = self._writable(cert_id)
        record = self.read_record(cert_id, path)
        if record is None:
            raise NotFound(f"{self.uri}: no certificate {cert_id!r}")
        removed: set[str] = set()
        try:
            for alias in self.aliases_of(cert_id).values():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.root / alias)
                removed.add(alias)
            os.unlink(path)
            drop_mark(self.root, cert_id)
            fsync_dir(self.root)
        except FileNotFoundError:
            raise NotFound(f"{self.uri}: no certificate {cert_id!r}") from None
        except OSError as exc:
            raise StoreUnavailable(
                f"{self.uri}: cannot delete {cert_id!r}: {exc.strerror}"
            ) from exc
        return record, removed

    def aliases_of(self, cert_id: str) -> dict[str, str]:
        """{name: alias file} of the aliases pointing to ``cert_id``."""
        aliases: dict[str, str] = {}
        with os.scandir(self.root) as entries:
            for entry in entries:
                if not entry.name.endswith(".pem") or not entry.is_symlink():
                    continue
                name = name_of_stem(entry.name[:-4])
                if name is not None and os.readlink(entry.path) == cert_id:
                    aliases[name] = entry.name
        return aliases

    def _link_aliases(self, cert_id: str, names: list[str]) -> None:
        for name in names:
            alias = f"{file_stem(name)}.pem"
            holder = self.holder(name)
            if holder is None:
                try:
                    os.symlink(cert_id, self.root / alias)
                    continue
                except FileExistsError:
                    holder = alias
            log.warning(
                "%s: %s is not linked to %s: %s is already there", self.uri, name, cert_id, holder
            )

    def write(self, files: list[str], data: bytes) -> None:
        try:
            for name in files:
                atomic_write(self.root, name, data)
            fsync_dir(self.root)
        except OSError as exc:
            raise StoreUnavailable(
                f"{self.uri}: cannot write {files[0]!r}: {exc.strerror}"
            ) from exc
