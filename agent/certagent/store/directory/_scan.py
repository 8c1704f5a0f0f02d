"""The directory store's blocking scans: what is in root and ``live/``, run on worker threads.

Plain functions on paths, called by :class:`certagent.store.directory._watch.DirWatcher`
(and the record listing) through the store's bounded threads.  Costs: one
``stat`` per file; two ``stat`` per lineage, plus one read and one parse
(≈80 µs) for a lineage that is new or changed.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from certagent.certs.pem import leaf_names
from certagent.errors import CertificateError, StoreCorrupt, StoreUnavailable
from certagent.store.directory import _inotify
from certagent.store.directory._files import Entry, read_regular, signature
from certagent.store.directory._index import FULLCHAIN, LIVE, PRIVKEY, Lineage, name_of_stem

__all__ = [
    "REMOTE_FILESYSTEMS",
    "alias_target",
    "file_entries",
    "lineage_entries",
    "list_live",
    "list_root",
    "read_mountinfo",
    "remote_filesystem",
]

log = logging.getLogger(__name__)

#: A scanning thread lets the event loop have the GIL after this long (s).  Python
#: forces a switch after 5 ms anyway; one yield costs a system call (≈0.15 ms here).
YIELD_AFTER = 0.002

#: Filesystems whose changes made elsewhere inotify does not see.
REMOTE_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "9p",
        "virtiofs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.rclone",
        "fuse.gcsfuse",
        "fuse.glusterfs",
        "fuse.ceph-fuse",
        "fuse.grpcfuse",
    }
)


def alias_target(root: Path, filename: str) -> str | None:
    """If ``root/filename`` is an alias (a symlink to a record file in root), that file's name."""
    try:
        target = os.readlink(root / filename)
    except OSError:
        return None  # not a symlink, or gone
    if "/" in target or target == filename or not target.endswith(".pem"):
        return None
    if name_of_stem(target[:-4]) is None:
        return None
    try:
        entry = os.lstat(root / target)
    except OSError:
        return None
    return target if stat.S_ISREG(entry.st_mode) else None


def list_root(root: Path, uri: str) -> list[str]:
    """The names of the files in root that a lookup could read (``<name>.pem``)."""
    try:
        with os.scandir(root) as entries:
            names = [e.name for e in entries if e.name.endswith(".pem")]
    except OSError as exc:
        raise StoreUnavailable(f"{uri}: cannot list: {exc.strerror}") from exc
    return [n for n in names if name_of_stem(n[:-4]) is not None]


def file_entries(root: Path, filenames: Sequence[str]) -> dict[str, Entry | None]:
    """Each file's entry (None if it is gone or not a regular file)."""
    found: dict[str, Entry | None] = {}
    turn = time.monotonic() + YIELD_AFTER
    for filename in filenames:
        if time.monotonic() > turn:
            time.sleep(0)  # let the event loop have the GIL
            turn = time.monotonic() + YIELD_AFTER
        name = name_of_stem(filename[:-4])
        sig = signature(root / filename) if name is not None else None
        if name is None or sig is None:
            found[filename] = None
            continue
        sig = (*sig, *(signature(root / f"{filename}.ocsp") or ()))  # a new response: a change
        found[filename] = Entry(alias_target(root, filename) or filename, name, sig)
    return found


def list_live(root: Path, uri: str, inotify: _inotify.Inotify | None) -> list[str]:
    """The lineage directories in ``live/`` (valid names only); watch ``live/`` first."""
    live = root / LIVE
    try:
        if inotify is not None:
            inotify.add_watch(live, LIVE)
        with os.scandir(live) as entries:
            names = [e.name for e in entries]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except _inotify.WatchLimit:
        raise
    except OSError as exc:
        raise StoreUnavailable(f"{uri}: cannot list {LIVE}: {exc.strerror}") from exc
    return [n for n in names if name_of_stem(n) is not None]


def lineage_entries(
    root: Path,
    uri: str,
    dirnames: Iterable[str],
    known: dict[str, Lineage | None],
    inotify: _inotify.Inotify | None,
) -> dict[str, Lineage | None]:
    """Each lineage as it is now (None: not a lineage); watched first, so no change is missed.

    The certificate is read only if its files differ from ``known``.  About
    80 µs per new lineage (two ``stat``, a read, a parse), 10 µs per known one.
    """
    found: dict[str, Lineage | None] = {}
    base = os.path.join(root, LIVE)
    turn = time.monotonic() + YIELD_AFTER
    for dirname in dirnames:
        if time.monotonic() > turn:
            time.sleep(0)  # let the event loop have the GIL
            turn = time.monotonic() + YIELD_AFTER
        live = os.path.join(base, dirname)
        if inotify is not None:
            try:
                inotify.add_watch(Path(live), f"{LIVE}/{dirname}")
            except (FileNotFoundError, NotADirectoryError):
                found[dirname] = None
                continue
            except _inotify.WatchLimit:
                raise
            except OSError as exc:
                raise StoreUnavailable(
                    f"{uri}: cannot watch {LIVE}/{dirname}: {exc.strerror}"
                ) from exc
        chain = signature(os.path.join(live, FULLCHAIN))
        if chain is None:
            found[dirname] = None
            continue
        key = signature(os.path.join(live, PRIVKEY)) or ()
        ocsp = signature(os.path.join(live, f"{FULLCHAIN}.ocsp")) or ()
        sig = hash((*chain, *key, *ocsp))
        before = known.get(dirname)
        if before is not None and before[0] == sig:
            found[dirname] = before
            continue
        found[dirname] = (sig, _sans(root, dirname, uri))
    return found


def _sans(root: Path, dirname: str, uri: str) -> tuple[str, ...]:
    relative = f"{LIVE}/{dirname}/{FULLCHAIN}"
    try:
        data, _ = read_regular(root / relative, f"{uri}: {relative}")
        names = leaf_names(data)
    except (OSError, StoreCorrupt, CertificateError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) else str(exc)
        log.warning("%s: %s: not indexed by its names: %s", uri, relative, detail)
        return ()
    # The name equal to the directory's shares its string (memory at N lineages).
    return tuple(dirname if n == dirname else n for n in names)


def remote_filesystem(path: Path, mountinfo: str) -> str | None:
    """The type of the filesystem holding ``path`` if inotify cannot see changes made elsewhere."""
    target = os.path.realpath(path)
    best, kind = "", ""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind if kind in REMOTE_FILESYSTEMS else None


def read_mountinfo() -> str:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        log.debug("cannot read /proc/self/mountinfo (%s): taking the filesystem as local", exc)
        return ""
