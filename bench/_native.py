"""The native load generator (``bench/tlsload.c``): build it, run a storm, probe a host.

On the bench's 2 vCPUs the pure-Python storm client (:func:`bench._load.storm`)
needs a core of its own and competes with HAProxy, so its scheduling delays end
up in the latencies it reports.  ``tlsload`` makes the same verified handshakes
(TLS 1.2+, the bench root only, hostname checking, no session reuse) from one
epoll loop in C.  The bench uses it when a C compiler and the OpenSSL headers
are there::

    built = try_build(work)                  # .binary is None -> .reason says why
    result = await storm_native(built.binary, port, hosts, cafile, 200, 1.0)
    with NativeProber(built.binary, port, warm_host, cafile) as probe:
        ...
    probe.samples, probe.failures

The results have the Python generators' shapes (:class:`bench._load.StormResult`,
``Prober.samples``/``.failures``) and error keys.  Every child is started here
and stopped by its own PID.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import select
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._load import TIMEOUT, StormResult

__all__ = [
    "SOURCE",
    "Build",
    "NativeLoadError",
    "NativeProber",
    "storm_native",
    "try_build",
]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("tlsload.c")
BINARY_NAME = "tlsload"
LABEL = "bench/tlsload.c (C, OpenSSL, epoll)"  # how reports name this client
COMPILE_TIMEOUT = 120.0
# What tlsload accepts (it checks again): the names the bench generates.
_HOSTNAME = re.compile(r"[A-Za-z0-9._-]{1,253}")


class NativeLoadError(RuntimeError):
    """tlsload could not be built, did not start, failed, or printed something unexpected."""


# --- building ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    """The compiled ``tlsload`` (``binary``), or None and why not (``reason``)."""

    binary: Path | None
    reason: str = ""


def _compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def try_build(work: Path, source: Path = SOURCE) -> Build:
    """Compile ``source`` into ``work/tlsload`` unless an up-to-date binary is there.

    A missing compiler or missing OpenSSL headers is not an error: the result
    has no binary and a ``reason`` (the bench then falls back to the Python
    generator).  A compile failure for any other cause is reported the same
    way, with the compiler's last lines.
    """
    binary = work / BINARY_NAME
    if binary.exists() and binary.stat().st_mtime >= source.stat().st_mtime:
        return Build(binary)
    compiler = _compiler()
    if compiler is None:
        return Build(None, "no C compiler (cc or gcc) on PATH")
    work.mkdir(parents=True, exist_ok=True)
    partial = work / f".{BINARY_NAME}.{os.getpid()}.tmp"
    argv = [compiler, "-O2", "-Wall", "-Wextra", "-o", str(partial), str(source)]
    try:
        proc = subprocess.run(
            [*argv, "-lssl", "-lcrypto"],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        partial.unlink(missing_ok=True)
        return Build(None, f"{compiler} did not run: {exc}")
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        if re.search(r"openssl/\S+\.h: No such file", proc.stderr):
            return Build(None, "no OpenSSL headers (install libssl-dev)")
        last = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return Build(None, f"{compiler} failed with status {proc.returncode}: {last}")
    os.replace(partial, binary)  # atomic: a concurrent build never sees half a binary
    return Build(binary)


# --- the storm ---------------------------------------------------------------------------


def _check_host(host: str) -> str:
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"tlsload takes hostnames of letters, digits, '.', '-', '_': {host!r}")
    return host


def _host_lines(hosts: Sequence[str]) -> bytes:
    for host in hosts:
        _check_host(host)
    return "".join(f"{host}\n" for host in hosts).encode("ascii")


def _seconds(value: Any, what: str) -> list[float]:
    if not isinstance(value, list) or not all(isinstance(v, int | float) for v in value):
        raise NativeLoadError(f"tlsload: {what} is not a list of numbers")
    return [float(v) for v in value]


def _storm_result(out: bytes, hosts: int) -> StormResult:
    try:
        raw = json.loads(out)
        errors = {str(k): int(v) for k, v in raw["errors"].items()}
        result = StormResult(
            ok=int(raw["ok"]),
            failed=int(raw["failed"]),
            latencies=_seconds(raw["latencies"], "latencies"),
            launch_span=float(raw["launch_span"]),
            seconds=float(raw["seconds"]),
            errors=errors,
            t0=float(raw["t0"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise NativeLoadError(f"tlsload storm printed {out[:200]!r}") from exc
    if result.ok + result.failed != hosts or len(result.latencies) != result.ok:
        raise NativeLoadError(f"tlsload storm counts do not add up to {hosts} hosts: {result}")
    return result


async def storm_native(
    binary: Path,
    port: int,
    hosts: Sequence[str],
    cafile: Path,
    concurrency: int,
    spread: float,
    timeout: float = TIMEOUT,
) -> StormResult:
    """:func:`bench._load.storm` done by ``tlsload``: a verified handshake for every host,
    started evenly over ``spread`` s, at most ``concurrency`` at once, each bounded by
    ``timeout`` s; handshake latency from connect()."""
    stdin = _host_lines(hosts)
    # tlsload bounds itself; this is the bound on waiting for it, should it hang anyway.
    waves = math.ceil(len(hosts) / max(1, concurrency))
    limit = spread + timeout * (waves + 1) + 10.0
    proc = await asyncio.create_subprocess_exec(
        str(binary), "storm",
        "--port", str(port),
        "--cafile", str(cafile),
        "--concurrency", str(concurrency),
        "--spread", repr(float(spread)),
        "--timeout", repr(float(timeout)),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C reaches only us; we stop it
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), limit)
    except TimeoutError as exc:
        raise NativeLoadError(f"tlsload storm (pid {proc.pid}) ran over {limit:.0f} s") from exc
    finally:
        if proc.returncode is None:
            proc.kill()  # this PID only
            await proc.wait()
    if proc.returncode != 0:
        raise NativeLoadError(
            f"tlsload storm exited with {proc.returncode}: {err.decode(errors='replace')[-2000:]}"
        )
    if err:
        log.debug("tlsload storm: %s", err.decode(errors="replace").strip())
    return _storm_result(out, len(hosts))


# --- the warm-host prober ----------------------------------------------------------------


class NativeProber:
    """:class:`bench._load.Prober` done by ``tlsload probe``: a verified handshake for
    ``host`` every ``interval`` s from a separate process, until the context exits.

    With ``connections`` > 1 the starts keep their schedule (open loop) with up to that
    many handshakes in flight; with 1 each waits for the one before (the Python
    prober's behaviour).  ``__enter__`` returns once the child says ``ready``;
    ``__exit__`` closes its stdin (which stops it), waits for its JSON and fills
    ``samples`` (seconds), ``starts`` (each sample's start on time.monotonic()'s
    clock), ``failures``, ``late`` (starts delayed because every connection was busy)
    and ``cpu_s`` (the prober's own CPU time).  A child that does not stop is killed
    by its PID.
    """

    def __init__(
        self,
        binary: Path,
        port: int,
        host: str,
        cafile: Path,
        interval: float = 0.01,
        timeout: float = TIMEOUT,
        connections: int = 1,
    ) -> None:
        _check_host(host)
        self._argv = [
            str(binary), "probe",
            "--port", str(port),
            "--cafile", str(cafile),
            "--host", host,
            "--interval", repr(float(interval)),
            "--connections", str(int(connections)),
            "--timeout", repr(float(timeout)),
        ]  # fmt: skip
        self._timeout = timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self.samples: list[float] = []
        self.starts: list[float] = []
        self.failures = 0
        self.late = 0
        self.cpu_s = 0.0

    def __enter__(self) -> NativeProber:
        proc = self._proc = subprocess.Popen(
            self._argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # a few lines at most: it cannot fill the pipe
            start_new_session=True,
        )
        try:
            first = self._first_line(proc)
            if first != b"ready\n":
                _, err = self._stop()
                raise NativeLoadError(
                    f"tlsload probe did not start (printed {first!r}, exit status "
                    f"{proc.returncode}): {err.decode(errors='replace')[-2000:]}"
                )
        except BaseException:
            if proc.returncode is None:
                self._stop()
            raise
        return self

    @property
    def pid(self) -> int | None:
        """The prober's process ID while it runs (None before ``__enter__``)."""
        return None if self._proc is None else self._proc.pid

    def _first_line(self, proc: subprocess.Popen[bytes]) -> bytes:
        """Its first stdout line, read unbuffered (communicate() reads the rest), bounded."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        line = b""
        deadline = time.monotonic() + self._timeout
        while not line.endswith(b"\n") and len(line) < 100:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 100 - len(line)) if readable else b""
            if not chunk:
                break
            line += chunk
        return line

    def _stop(self) -> tuple[bytes, bytes]:
        """Close its stdin, wait (bounded), kill it by PID if it is still there."""
        proc = self._proc
        if proc is None:
            return b"", b""
        try:
            # communicate() closes stdin first: EOF is tlsload's signal to stop.
            return proc.communicate(timeout=self._timeout * 2)
        except subprocess.TimeoutExpired:
            proc.kill()  # this PID only
            return proc.communicate(timeout=self._timeout)

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        out, err = self._stop()
        proc = self._proc
        if proc is None or exc_type is not None:
            return  # stopped; the body's exception is the one to see
        if proc.returncode != 0:
            raise NativeLoadError(
                f"tlsload probe exited with {proc.returncode}: "
                f"{err.decode(errors='replace')[-2000:]}"
            )
        if err:
            log.debug("tlsload probe: %s", err.decode(errors="replace").strip())
        try:
            raw = json.loads(out)
            self.samples = _seconds(raw["samples"], "samples")
            self.starts = _seconds(raw["starts"], "starts")
            self.failures = int(raw["failures"])
            self.late = int(raw["late"])
            self.cpu_s = float(raw["cpu_s"])
        except (ValueError, KeyError, TypeError) as exc:
            raise NativeLoadError(f"tlsload probe printed {out[:200]!r}") from exc
        if len(self.starts) != len(self.samples):
            raise NativeLoadError("tlsload probe: as many starts as samples expected")
