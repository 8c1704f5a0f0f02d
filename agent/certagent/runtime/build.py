"""Which HAProxy build runs, and what that changes for certagent.

HAProxy's runtime API tells its version (``show info``) but not the TLS library
it runs on.  HAProxy 3.0 and later answer ``show dev`` with the same lines as
``haproxy -vv``; 2.6 has no ``show dev``, so the executable named by the first
line of ``show libs`` is asked with ``-vv`` instead.  Both texts are parsed here
(:func:`parse_build`, no I/O); :func:`probe_build` does the asking.  Each costs
one runtime-API command (and on 2.6 one short-lived process): callers ask once
per HAProxy worker, not per request.

:func:`differences` names what differs for certagent on the build in use
(measured: ``docs/haproxy.md``, "HAProxy versions").
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from dataclasses import dataclass

from certagent.errors import HAProxyError
from certagent.runtime import protocol
from certagent.runtime.client import query

#: OpenSSL from which HAProxy offers the post-quantum hybrid X25519MLKEM768.
PQ_OPENSSL = (3, 5)
_VERSION = re.compile(r"^HA-?Proxy version (\S+)", re.M)
_OPENSSL = re.compile(r"^\s*Running on (?:OpenSSL|SSL library) version : (.+?)\s*$", re.M)
_LUA = re.compile(r"^\s*Built with Lua version : (.+?)\s*$", re.M)
_NUMBERS = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
# "Feature list : +A -B" (haproxy -vv), or "Features" ("Features:" from 3.4 on) and the list
# on the next line (show dev)
_FEATURES = re.compile(r"^(?:Feature list :|Features:?[ \t]*\n)\s*([+-][^\n]*)$", re.M)
#: The oldest HAProxy branch certagent serves HTTP/3 on (tested: 3.0, 3.2, 3.4).
HTTP3_BRANCH = (3, 0)


def _numbers(text: str | None) -> tuple[int, int, int] | None:
    match = _NUMBERS.search(text or "")
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


@dataclass(frozen=True)
class HAProxyBuild:
    """A running HAProxy's version and the libraries that matter to certagent."""

    version: str  # as ``show info`` says it: "2.6.12-1+deb12u4", "3.2.26-1"
    openssl: str | None  # the TLS library it runs on: "OpenSSL 3.5.9 29 Sep 2026"
    lua: str | None  # "Lua 5.4.7"
    # the build's features enabled ("+QUIC" in ``haproxy -vv``), None if the text had no list
    features: frozenset[str] | None = None

    @property
    def branch(self) -> tuple[int, int]:
        """(major, minor) of the HAProxy version: (2, 6), (3, 2)."""
        numbers = _numbers(self.version)
        return (numbers[0], numbers[1]) if numbers else (0, 0)

    @property
    def openssl_version(self) -> tuple[int, int, int] | None:
        return _numbers(self.openssl) if self.openssl and "OpenSSL" in self.openssl else None

    @property
    def post_quantum(self) -> bool | None:
        """Whether the library offers X25519MLKEM768 (OpenSSL >= 3.5); None if unknown."""
        version = self.openssl_version
        return None if version is None else version[:2] >= PQ_OPENSSL

    @property
    def quic(self) -> bool | None:
        """Whether HAProxy was built with QUIC (HTTP/3); None if unknown."""
        return None if self.features is None else "QUIC" in self.features

    @property
    def limited_quic(self) -> bool:
        """QUIC on OpenSSL's compatibility layer (Debian 13's 3.0): needs ``limited-quic``."""
        return self.features is not None and "QUIC_OPENSSL_COMPAT" in self.features

    def describe(self) -> str:
        """One line: ``HAProxy 3.2.26-1, OpenSSL 3.6.5, Lua 5.4.9``."""
        openssl = _short(self.openssl) or "TLS library unknown"
        return f"HAProxy {self.version}, {openssl}, {_short(self.lua) or 'Lua unknown'}"

    def as_dict(self) -> dict[str, object]:
        return {
            "version": self.version,
            "openssl": self.openssl,
            "lua": self.lua,
            "post_quantum": self.post_quantum,
            "quic": self.quic,
            "differences": differences(self),
        }


def _short(text: str | None) -> str | None:
    """``OpenSSL 3.6.5 29 Sep 2026`` -> ``OpenSSL 3.6.5`` (the release date dropped)."""
    if not text:
        return None
    return " ".join(text.split()[:2])


def parse_build(text: str, version: str | None = None) -> HAProxyBuild:
    """The build from ``haproxy -vv`` or ``show dev`` output; ``version`` overrides its own.

    HAProxyError if the text names no version and none is given.
    """
    found = _VERSION.search(text)
    if version is None:
        if found is None:
            raise HAProxyError(f"no HAProxy version in {text[:80]!r}")
        version = found[1]
    openssl, lua = _OPENSSL.search(text), _LUA.search(text)
    listed = _FEATURES.search(text)
    features = (
        frozenset(word[1:] for word in listed[1].split() if word.startswith("+"))
        if listed
        else None
    )
    return HAProxyBuild(version, openssl[1] if openssl else None, lua[1] if lua else None, features)


def http3_problem(build: HAProxyBuild, where: str = "") -> str | None:
    """Why HTTP/3 (``certagent init --http3``) cannot be served by ``build``; None if it can.

    ``where`` names the binary or socket, for the message.
    """
    at = f" ({where})" if where else ""
    if build.branch < HTTP3_BRANCH:
        return (
            f"HAProxy {build.version}{at} cannot serve certagent's HTTP/3: it needs HAProxy"
            f" {HTTP3_BRANCH[0]}.{HTTP3_BRANCH[1]} or later built with QUIC (Debian 13's 3.0,"
            " Debian unstable's 3.2); run init without --http3, or name a newer binary with"
            " --haproxy"
        )
    if build.quic is None:
        return (
            f"cannot tell whether HAProxy {build.version}{at} is built with QUIC (its feature"
            " list is unknown); HTTP/3 needs a build with USE_QUIC"
        )
    if not build.quic:
        return (
            f"HAProxy {build.version}{at} is built without QUIC (no +QUIC in 'haproxy -vv'):"
            " HTTP/3 needs a build with USE_QUIC, such as Debian's packages from 3.0 on"
        )
    return None


def binary_build(path: str, timeout: float = 10.0) -> HAProxyBuild:
    """The build of the HAProxy executable ``path`` (``path -vv``); HAProxyError if it fails.

    For ``certagent init``, before any HAProxy runs; one short-lived process.
    """
    try:
        out = subprocess.run(
            [path, "-vv"],
            capture_output=True,
            timeout=timeout,
            check=True,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise HAProxyError(f"cannot run {path} -vv: {exc}") from exc
    return parse_build(out.stdout.decode("utf-8", "replace"))


def executable_from_libs(text: str) -> str | None:
    """The executable's path: the first object ``show libs`` lists (``0x..-0x.. (0x..) PATH``)."""
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0].startswith("0x") and parts[2].startswith("/"):
            return parts[2]
    return None


def differences(build: HAProxyBuild) -> list[str]:
    """What certagent does differently, or must know, on this build (one line each)."""
    notes: list[str] = []
    if build.branch < (3, 0):
        notes += [
            "deleting a crt-list entry leaks ~20 KB: slots are recycled in place, never deleted",
            "a second writer's certificate update is merged into the open transaction: the agent"
            " is the only writer",
            "dual ECDSA+RSA certificates: RSA-PSS-only clients fail and TLS 1.3 clients get RSA"
            " (docs/haproxy.md#dual-certificates-ecdsa--rsa-for-one-name)",
            "a commit cut short leaves a transaction on freed memory: the agent reloads HAProxy",
        ]
    else:
        notes += [
            "deleting a crt-list entry no longer leaks and a second writer is refused (the agent"
            " still recycles slots in place and is the only writer)",
            "dual ECDSA+RSA certificates: every client gets one it supports",
            "a commit cut short still crashes the worker: never cut a commit",
            "Lua: one state per thread (lua-load-per-thread), the collector at its defaults",
        ]
    if build.branch >= (3, 2):
        notes.append("tune.lua.bool-sample-conversion normal (set before lua-load)")
    if build.limited_quic:
        notes.append("HTTP/3: QUIC on OpenSSL's compatibility layer (limited-quic; no 0-RTT)")
    elif build.quic and build.branch >= HTTP3_BRANCH:
        notes.append("HTTP/3: QUIC on the TLS library's own QUIC support")
    if build.post_quantum:
        notes.append("X25519MLKEM768 offered first (OpenSSL 3.5+)")
    elif build.post_quantum is False:
        notes.append("no X25519MLKEM768 (needs OpenSSL 3.5+): X25519 first")
    else:
        notes.append("TLS library version unknown: curves as for OpenSSL before 3.5")
    return notes


async def probe_build(socket_path: str, version: str, timeout: float = 5.0) -> HAProxyBuild:
    """Ask the HAProxy at ``socket_path`` (version ``version``, from ``show info``).

    ``show dev`` (3.0+); else ``<executable> -vv`` with the path ``show libs``
    gives.  HAProxyError if the runtime API does not answer; a build with the
    libraries unknown if the executable cannot be run (another user's, gone).
    """
    dev = await query(socket_path, protocol.show_build(dev=True), timeout=timeout)
    if _VERSION.search(dev):
        return parse_build(dev, version)
    libs = await query(socket_path, protocol.show_build(dev=False), timeout=timeout)
    exe = executable_from_libs(libs)
    if exe is None or exe.endswith(" (deleted)"):
        return HAProxyBuild(version, None, None)
    try:
        proc = await asyncio.create_subprocess_exec(
            exe,
            "-vv",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return HAProxyBuild(version, None, None)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return HAProxyBuild(version, None, None)
    text = out.decode("utf-8", "replace")
    found = _VERSION.search(text)
    if found is None or found[1] != version:  # the binary on disk is not the one running
        return HAProxyBuild(version, None, None)
    return parse_build(text, version)
