"""A real browser, Debian's headless Chromium, on a host the agent has never seen.

Driven through Playwright for Python with ``executable_path=/usr/bin/chromium``
(Playwright's own browser downloads are never used).  The test CA goes into an
NSS database under a private ``$HOME``, where Chromium on Linux reads its
trust, so the certificate is verified by the browser itself.  The DevTools
protocol's ``securityDetails`` of the response tell the certificate, the TLS
version and the key exchange group: X25519MLKEM768 (the post-quantum hybrid
current Chromium offers first) where HAProxy runs on OpenSSL 3.5 or later
(Debian's 3.0 and 3.2), X25519 on Debian 12's 2.6 (OpenSSL 3.0).

With ``certagent init --http3`` (HAProxy built with QUIC), the same browser with QUIC
on moves to HTTP/3 after its first response's Alt-Svc, and after the host is
recycled, comes back through TCP when its HTTP/3 handshake meets the default
certificate.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from certagent.runtime.build import http3_problem
from certagent.testing import HAPROXY, PKI, RedisFixture, haproxy_build, wait_for
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
HOST = "never-seen.browser.test"
# The network is closed: no background requests, updates, sync or QUIC.
QUIET = [
    "--no-sandbox",  # we run as root
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
NO_QUIC = [*QUIET, "--disable-quic"]


def _trusting_home(home: Path, cafile: Path) -> Path:
    """A ``$HOME`` whose NSS database (``.pki/nssdb``) trusts ``cafile`` for servers."""
    certutil = shutil.which("certutil")
    assert certutil, "certutil is missing: run scripts/install.sh --test (libnss3-tools)"
    nssdb = home / ".pki" / "nssdb"
    nssdb.mkdir(parents=True)
    subprocess.run([certutil, "-d", f"sql:{nssdb}", "-N", "--empty-password"], check=True)
    subprocess.run(
        [certutil, "-d", f"sql:{nssdb}", "-A", "-t", "C,,", "-n", "certagent test CA",
         "-i", str(cafile)],
        check=True,
    )  # fmt: skip
    return home


@pytest.mark.timeout(180)
def test_chromium_gets_the_right_certificate_h2_and_the_best_key_exchange(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    assert Path(CHROMIUM).exists(), "chromium is missing: run scripts/install.sh --test"
    redis_store.put([pki.bundle(HOST)])
    stack = make_stack(redis_store.url, capacity=10)
    assert stack.marked_hosts() == {}  # never seen: the browser's connection loads it
    home = _trusting_home(tmp_path / "home", stack.cafile)
    responses: list[dict[str, Any]] = []
    url = f"https://{HOST}:{stack.port}/"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            env={"HOME": str(home)},
            args=[*NO_QUIC, f"--host-resolver-rules=MAP {HOST} 127.0.0.1:{stack.port}"],
        )
        try:
            page = browser.new_page()
            devtools = page.context.new_cdp_session(page)
            devtools.on("Network.responseReceived", lambda e: responses.append(e["response"]))
            devtools.send("Network.enable")
            reply = page.goto(url, timeout=30_000)
            assert reply is not None and reply.status == 200
            assert reply.text() == "ok\n"
        finally:
            browser.close()
    (response,) = [r for r in responses if r["url"] == url]  # the page (a favicon follows)
    details = response["securityDetails"]
    print(f"Chromium on {haproxy_build().describe()}: {response['protocol']}, {details}")
    assert response["protocol"] == "h2"
    assert details["sanList"] == [HOST]
    assert details["issuer"] == "certagent integration CA intermediate"
    assert details["protocol"] == "TLS 1.3"
    want = "X25519MLKEM768" if haproxy_build().post_quantum else "X25519"
    assert details["keyExchangeGroup"] == want
    assert set(stack.marked_hosts()) == {HOST}
    assert stack.status()["ensure"]["loaded"] == 1


def _quic_on(host: str) -> list[str]:
    """Chromium's flags for HTTP/3 to ``host`` through Alt-Svc, trusting the test CA there too.

    Chromium accepts a QUIC certificate only from a root it ships, unless the host
    is named by ``--origin-to-force-quic-on`` (its proof verifier allows unknown roots
    for those hosts). The flag names port 1, which is never visited: the visited
    origin is not forced onto QUIC and learns HTTP/3 from Alt-Svc like any site.
    """
    return [
        *QUIET,
        "--enable-quic",
        f"--origin-to-force-quic-on={host}:1",
        f"--host-resolver-rules=MAP {host} 127.0.0.1",
    ]


@pytest.mark.timeout(180)
@pytest.mark.skipif(
    http3_problem(haproxy_build(), HAPROXY) is not None,
    reason=f"no HTTP/3 on the HAProxy under test: {http3_problem(haproxy_build(), HAPROXY)}",
)
def test_chromium_moves_to_http3_and_comes_back_after_a_recycle(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    assert Path(CHROMIUM).exists(), "chromium is missing: run scripts/install.sh --test"
    host = "never-seen.h3.browser.test"
    others = [f"other{i}.h3.browser.test" for i in range(2)]
    redis_store.put([pki.bundle(name) for name in (host, *others)])
    stack = make_stack(redis_store.url, capacity=1, init_args=["--http3", "--haproxy", HAPROXY])
    assert stack.marked_hosts() == {}
    home = _trusting_home(tmp_path / "home", stack.cafile)
    profile = tmp_path / "profile"  # the browser's profile keeps the Alt-Svc across restarts
    url = f"https://{host}:{stack.port}/"

    def quic_connections() -> int:
        return int(stack.status()["http3"]["quic"]["connections"])

    def visits(count: int, settle: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
        """``count`` visits in a browser started on ``profile``: each page's response.

        ``settle`` runs after the first visit, its page still open.
        """
        responses: list[dict[str, Any]] = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, env={"HOME": str(home)},
                args=_quic_on(host),
            )  # fmt: skip
            try:
                for visit in range(count):
                    if visit == 1:
                        settle()
                    page = browser.new_page()
                    devtools = page.context.new_cdp_session(page)
                    devtools.on(
                        "Network.responseReceived", lambda e: responses.append(e["response"])
                    )
                    devtools.send("Network.enable")
                    reply = page.goto(url, timeout=30_000)
                    assert reply is not None and reply.status == 200
                    assert reply.text() == "ok\n"
            finally:
                browser.close()
        pages = [r for r in responses if r["url"] == url]
        for response in pages:  # every one verified by the browser, with the host's certificate
            details = response["securityDetails"]
            assert details["sanList"] == [host]
            assert details["issuer"] == "certagent integration CA intermediate"
            assert details["certificateTransparencyCompliance"] != "not-compliant"
        assert len(pages) == count
        return pages

    # two visits to a host never seen: the first over TCP loads it, the second is HTTP/3.
    # Chromium opens its QUIC connection in the background, after the first response's Alt-Svc
    # (with that page's next request): the second visit waits for it, or it would use the
    # HTTP/2 connection still open
    def quic_up() -> None:
        wait_for(lambda: quic_connections() >= 1, 15.0, "Chromium's QUIC connection")

    first, second = visits(2, quic_up)
    print(f"Chromium on {haproxy_build().describe()}: {first['protocol']}, {second['protocol']}")
    assert (first["protocol"], second["protocol"]) == ("h2", "h3")
    assert first["headers"]["alt-svc"].startswith(f'h3=":{stack.port}"; ma=')
    assert stack.status()["ensure"]["loaded"] == 1
    # the host's slot goes to other hosts; the browser comes back later, Alt-Svc remembered
    for other in others:
        assert stack.handshake(other).san == (other,)
    assert host not in stack.marked_hosts()
    refused = stack.status()["http3"]["quic"]["refused"]
    (third,) = visits(1)
    http3 = stack.status()["http3"]
    print(f"after a recycle: {third['protocol']}, {http3}")
    # its HTTP/3 handshake met the default certificate; TCP loaded the host again
    assert http3["quic"]["refused"] > refused
    assert http3["returns"] == 1
    assert third["protocol"] == "h2"
