"""Earlier releases of certagent, built from this checkout's git history, to run beside HEAD.

The mixed-version tests (a fleet upgraded one node at a time) run an agent of an earlier
commit next to the one under test, on one store.  :func:`build_agent` makes that agent's
virtualenv once and keeps it outside the checkout (``/var/cache/certagent/agents/``, as
scripts/haproxy-versions.sh keeps HAProxy builds), keyed by the commit and by the runtime
lock it was installed from:

* ``git archive COMMIT`` into a scratch directory (nothing of the checkout is touched);
* a virtualenv holding this checkout's ``requirements/runtime.txt`` (hashes checked), so
  that an earlier release runs on the same dependency versions as HEAD: what differs is
  certagent's own code, the thing under test;
* that commit's package, built into a wheel by the running Python's pip without build
  isolation (the test environment's locked setuptools; nothing unpinned is fetched) and
  installed without dependencies.

One build at a time per commit (``flock``).  About 15 s with pip's cache, then free.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from certagent.errors import AgentError

__all__ = ["RELEASES", "AgentBuild", "BuildUnavailable", "build_agent", "repository_root"]

#: The earlier versions the mixed-fleet tests run, by name: the commit each is built from.
RELEASES = {
    # main before the million-certificate work: records as hashes (store format 1); it
    # neither announces itself nor reads packed records
    "003bece": "003becec73773da09ed11ad475751823f82bb60a",
    # release 0.2.0 (main at ce751ec): writes packed records (format 2), reads both, and
    # announces its data keys (but no version) every 20 s
    "0.2.0": "ce751ec",
}

CACHE = Path(os.environ.get("CERTAGENT_AGENT_CACHE", "/var/cache/certagent/agents"))


class BuildUnavailable(AgentError):
    """An earlier agent cannot be built here (no git history, no such commit, pip failed)."""


@dataclass(frozen=True)
class AgentBuild:
    """An earlier agent's virtualenv: :attr:`argv` runs its ``certagent`` command."""

    label: str
    commit: str
    venv: Path

    @property
    def argv(self) -> list[str]:
        return [str(self.venv / "bin" / "certagent")]


def repository_root() -> Path:
    """The checkout this package runs from (agent/certagent/testing/ -> the root)."""
    return Path(__file__).resolve().parents[3]


def build_agent(label: str, root: Path | None = None, cache: Path = CACHE) -> AgentBuild:
    """The agent of release ``label`` (a key of :data:`RELEASES`), built if not cached.

    BuildUnavailable (saying why) if this checkout has no git history holding that
    commit (a shallow clone: ``git fetch --unshallow``) or the build fails.
    """
    root = root or repository_root()
    commit = _resolve(root, RELEASES.get(label, label))
    lock = root / "requirements" / "runtime.txt"
    if not lock.is_file():
        raise BuildUnavailable(f"{lock} is missing: the runtime lock builds earlier agents")
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    home = cache / f"{commit[:12]}-{digest}"
    venv = home / "venv"
    build = AgentBuild(label, commit, venv)
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f"{commit[:12]}.lock"):
        if (home / "ready").is_file() and (venv / "bin" / "certagent").exists():
            return build
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        with tempfile.TemporaryDirectory(prefix="certagent-build-") as scratch:
            src, wheels = Path(scratch) / "src", Path(scratch) / "wheels"
            src.mkdir()
            archive = _run(["git", "-C", str(root), "archive", "--format=tar", commit], root)
            subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
            _run([sys.executable, "-m", "venv", str(venv)], root)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
            _run([*pip, "install", "-q", "--require-hashes", "--no-deps", "-r", str(lock)], root)
            _run(
                [
                    sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "-q",
                    "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src),
                ],
                root,
            )  # fmt: skip
            wheel = next(wheels.glob("certagent-*.whl"))
            _run([*pip, "install", "-q", "--no-deps", str(wheel)], root)
        (home / "ready").write_text(f"{label} {commit}\n")
    return build


def _resolve(root: Path, commit: str) -> str:
    try:
        out = _run(["git", "-C", str(root), "rev-parse", "--verify", f"{commit}^{{commit}}"], root)
    except BuildUnavailable as exc:
        raise BuildUnavailable(
            f"commit {commit} is not in {root}'s git history (a shallow clone? `git fetch"
            f" --unshallow`): {exc}"
        ) from exc
    return out.decode().strip()


def _run(argv: list[str], root: Path) -> bytes:
    try:
        done = subprocess.run(argv, cwd=root, capture_output=True, check=True, timeout=600)
    except subprocess.CalledProcessError as exc:
        raise BuildUnavailable(
            f"{' '.join(argv[:4])} ... failed: {exc.stderr.decode(errors='replace')[-2000:]}"
        ) from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildUnavailable(f"{' '.join(argv[:4])} ... failed: {exc}") from exc
    return done.stdout


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
