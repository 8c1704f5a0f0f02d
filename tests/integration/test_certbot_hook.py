"""The certbot deploy hook of docs/operations.md: a fake lineage, a real Redis, a live agent."""

from __future__ import annotations

import re
import shlex
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import redis
from cryptography import x509

from certagent.store.redis import Keys
from certagent.testing import certagent_argv
from certagent.testing.certbot import renew, write_lineage
from certagent.testing.certs import issue
from tests.integration.conftest import PKI, RedisFixture, Stack, StackFactory

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HOST = "hook.example.test"


def documented_hook(config: Path) -> str:
    """The hook script of docs/operations.md, run with this venv's certagent and ``config``."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    section = doc.split("## certbot: a deploy hook\n", 1)[1]
    script = re.search(r"```sh\n(#!/bin/sh\n.*?)```", section, flags=re.S)
    assert script is not None, "docs/operations.md lost its deploy hook"
    text = script.group(1)
    assert "/opt/certagent/bin/certagent" in text and "/etc/certagent/certagent.toml" in text
    command = " ".join(shlex.quote(arg) for arg in certagent_argv())
    return text.replace("/opt/certagent/bin/certagent", command).replace(
        "/etc/certagent/certagent.toml", shlex.quote(str(config))
    )


def serial(chain: bytes) -> int:
    return x509.load_pem_x509_certificate(chain).serial_number


def served_serial(stack: Stack, host: str) -> int | None:
    try:
        return stack.handshake(host).serial
    except (ssl.SSLError, OSError):
        return None


@pytest.mark.timeout(90)
def test_deploy_hook_adds_rotates_live_and_is_idempotent(
    redis_store: RedisFixture, pki: PKI, make_stack: StackFactory, tmp_path: Path
) -> None:
    stack = make_stack(redis_store.url, capacity=10)
    hook = tmp_path / "renewal-hooks" / "deploy" / "certagent"
    hook.parent.mkdir(parents=True)
    hook.write_text(documented_hook(stack.config_path))
    hook.chmod(0o755)
    letsencrypt = tmp_path / "letsencrypt"

    def run_hook() -> subprocess.CompletedProcess[str]:
        env = {**stack.env, "RENEWED_LINEAGE": str(letsencrypt / "live" / HOST),
               "RENEWED_DOMAINS": f"{HOST} www.{HOST}"}  # fmt: skip
        done = subprocess.run(
            [str(hook)], env=env, capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, done.stderr
        return done

    # certbot's first issuance
    chain1, key1 = issue(pki.ca, HOST, f"www.{HOST}")
    write_lineage(letsencrypt, HOST, chain1, key1)
    added = run_hook().stdout
    cert_id = re.match(rf"added ([0-9a-f]+) for {HOST} www\.{HOST} \(valid until ", added)
    assert cert_id is not None, added
    assert served_serial(stack, HOST) == serial(chain1)  # loaded into a slot
    assert served_serial(stack, f"www.{HOST}") == serial(chain1)

    # a renewal: new certificate and key, same names, through the hook
    chain2, key2 = issue(pki.ca, HOST, f"www.{HOST}")
    renew(letsencrypt, HOST, chain2, key2)
    rotated = run_hook().stdout
    assert rotated.startswith(f"rotated {cert_id.group(1)} to version 2 for {HOST} www.{HOST}")
    deadline = time.monotonic() + 10
    while served_serial(stack, HOST) != serial(chain2):  # swapped in live, no reload
        assert time.monotonic() < deadline, "the renewed certificate was not swapped in"
        time.sleep(0.05)
    assert served_serial(stack, f"www.{HOST}") == serial(chain2)

    # certbot runs the hook again (or an operator does): nothing changes
    again = run_hook()
    assert again.stdout.startswith(f"already stored as {cert_id.group(1)} (version 2)")
    keys = Keys()
    with redis.Redis.from_url(redis_store.url, decode_responses=True) as client:
        assert client.zrange(keys.ids(), 0, -1) == [cert_id.group(1)]
        assert client.type(keys.cert(cert_id.group(1))) == "string"
        assert client.zscore(keys.ids(), cert_id.group(1)) == 0
        assert client.smembers(keys.name(HOST)) == {cert_id.group(1)}
        puts = [f["id"] for _, f in client.xrange(keys.events()) if f["kind"] != "tls-keys"]
    assert puts == [cert_id.group(1)] * 2  # the add and the rotation; the third run wrote nothing
    assert served_serial(stack, HOST) == serial(chain2)
    stack.check_alive()
