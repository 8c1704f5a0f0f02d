"""A real browser, Debian's headless Chromium, on a host the agent has never seen.

Driven through Playwright for Python with ``executable_path=/usr/bin/chromium``
(Playwright's own browser downloads are never used).  The test CA goes into an
NSS database under a private ``$HOME``, where Chromium on Linux reads its
trust, so the certificate is verified by the browser itself.  The DevTools
protocol's ``securityDetails`` of the response tell the certificate, the TLS
version and the key exchange group: X25519MLKEM768 (the post-quantum hybrid
current Chromium offers first) where HAProxy runs on OpenSSL 3.5 or later
(Debian's 3.0 and 3.2), X25519 on Debian 12's 2.6 (OpenSSL 3.0).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from certagent.testing import PKI, RedisFixture, haproxy_build
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
    "--disable-quic",
]


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
            args=[*QUIET, f"--host-resolver-rules=MAP {HOST} 127.0.0.1:{stack.port}"],
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
