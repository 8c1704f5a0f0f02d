"""The native load generator (``bench/tlsload.c`` via :mod:`bench._native`) against a real
HAProxy preloading three certificates, and against ports that do not answer."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import _configs
from bench._native import NativeProber, storm_native, try_build
from certagent.testing import PKI, HAProxyProcess, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NAMES = ("a.native.test", "b.native.test", "c.native.test")
UNKNOWN = "nobody.native.test"  # not in the crt-list: HAProxy serves the default certificate
NOT_VERIFIED = "not verified (default certificate)"


@pytest.fixture(scope="module")
def tlsload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = try_build(tmp_path_factory.mktemp("tlsload"))
    if built.binary is None:
        pytest.skip(f"cannot build bench/tlsload.c: {built.reason}")
    return built.binary


@pytest.fixture(scope="module")
def haproxy(tmp_path_factory: pytest.TempPathFactory, pki: PKI) -> Iterator[HAProxyProcess]:
    """HAProxy with one TLS bind: NAMES from a crt-list, a default certificate for another name."""
    directory = tmp_path_factory.mktemp("haproxy")
    lines = []
    for name in NAMES:
        (directory / f"{name}.pem").write_bytes(pki.combined_pem(name))
        lines.append(f"{directory / name}.pem\n")
    (directory / "certs.crtlist").write_text("".join(lines))
    (directory / "default.pem").write_bytes(pki.combined_pem("default.native.test"))
    run_dir = Path(tempfile.mkdtemp(prefix="ca-"))  # a short path for the admin socket
    port = free_port()
    cfg = _configs.preload_config(
        directory / "haproxy.cfg",
        port=port,
        admin_socket=str(run_dir / "admin.sock"),
        default_cert=directory / "default.pem",
        crt_list=directory / "certs.crtlist",
        count=len(NAMES),
    )
    proc = HAProxyProcess(cfg, str(run_dir / "admin.sock"), port, directory / "haproxy.log")
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def test_storm_verifies_every_handshake(tlsload: Path, haproxy: HAProxyProcess, pki: PKI) -> None:
    hosts = list(NAMES) * 10
    result = asyncio.run(storm_native(tlsload, haproxy.port, hosts, pki.cafile, 10, 0.2))

    assert (result.ok, result.failed, result.errors) == (30, 0, {})
    assert len(result.latencies) == 30
    assert all(0 < s < 5 for s in result.latencies)
    assert 0.15 < result.launch_span <= result.seconds < 5


def test_storm_counts_the_default_certificate_as_not_verified(
    tlsload: Path, haproxy: HAProxyProcess, pki: PKI
) -> None:
    hosts = [*NAMES, UNKNOWN, *NAMES, UNKNOWN, UNKNOWN]
    result = asyncio.run(storm_native(tlsload, haproxy.port, hosts, pki.cafile, 4, 0.05))

    assert (result.ok, result.failed) == (6, 3)
    assert result.errors == {NOT_VERIFIED: 3}
    assert len(result.latencies) == 6


def test_prober_samples_a_good_host(tlsload: Path, haproxy: HAProxyProcess, pki: PKI) -> None:
    with NativeProber(tlsload, haproxy.port, NAMES[0], pki.cafile, interval=0.01) as probe:
        time.sleep(0.3)

    assert probe.failures == 0
    assert len(probe.samples) >= 5
    assert all(0 < s < 1 for s in probe.samples)


def test_open_loop_prober_keeps_its_schedule_with_several_in_flight(
    tlsload: Path, haproxy: HAProxyProcess, pki: PKI
) -> None:
    before = time.monotonic()
    with NativeProber(
        tlsload, haproxy.port, NAMES[0], pki.cafile, interval=0.005, connections=8
    ) as probe:
        time.sleep(0.5)
    after = time.monotonic()

    assert probe.failures == 0
    assert len(probe.samples) >= 20  # ~100 on a quiet machine
    assert len(probe.starts) == len(probe.samples)
    # starts are on time.monotonic()'s clock: within the prober's lifetime
    assert all(before <= t <= after for t in probe.starts)
    assert all(0 < s < 1 for s in probe.samples)
    assert probe.late >= 0 and probe.cpu_s > 0


def test_prober_fails_for_the_default_certificate(
    tlsload: Path, haproxy: HAProxyProcess, pki: PKI
) -> None:
    with NativeProber(tlsload, haproxy.port, UNKNOWN, pki.cafile, interval=0.02) as probe:
        time.sleep(0.1)

    assert probe.samples == []
    assert probe.failures >= 1


def test_unreachable_port_fails_fast(tlsload: Path, pki: PKI) -> None:
    port = free_port()  # nobody listens: connect() is refused
    started = time.monotonic()
    result = asyncio.run(storm_native(tlsload, port, list(NAMES) * 4, pki.cafile, 5, 0.1))
    with NativeProber(tlsload, port, NAMES[0], pki.cafile, interval=0.02) as probe:
        time.sleep(0.1)

    assert (result.ok, result.failed, result.latencies) == (0, 12, [])
    assert result.errors == {"ConnectionRefusedError": 12}
    assert probe.samples == [] and probe.failures >= 1
    assert time.monotonic() - started < 5


def test_silent_server_times_out(tlsload: Path, pki: PKI) -> None:
    """A listener that never accepts: TCP connects (backlog), the handshake never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        result = asyncio.run(
            storm_native(tlsload, port, list(NAMES), pki.cafile, 3, 0.0, timeout=0.3)
        )

    assert (result.ok, result.failed) == (0, 3)
    assert result.errors == {"TimeoutError": 3}
    assert result.seconds < 2


def test_bad_input_is_refused(tlsload: Path, pki: PKI) -> None:
    with pytest.raises(ValueError, match="hostnames"):
        asyncio.run(storm_native(tlsload, 1, ["bad host"], pki.cafile, 1, 0.0))
    usage = subprocess.run(
        [str(tlsload), "storm", "--port", "0", "--cafile", str(pki.cafile)],
        input=b"",
        capture_output=True,
        timeout=10,
        check=False,
    )
    assert usage.returncode == 2 and b"usage:" in usage.stderr
    storm_argv = [str(tlsload), "storm", "--port", "1", "--cafile", str(pki.cafile)]
    bad_line = subprocess.run(
        [*storm_argv, "--concurrency", "1", "--spread", "0"],
        input=b"ok.test\n\xc3\xa9.test\n",
        capture_output=True,
        timeout=10,
        check=False,
    )
    assert bad_line.returncode == 2 and b"line 2" in bad_line.stderr
