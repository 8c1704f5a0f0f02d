"""The runtime client against a fake runtime socket: framing, pipelining, failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from certagent.errors import HAProxyError, HAProxyTimeout, HAProxyUnavailable
from certagent.runtime import protocol
from certagent.runtime.client import RuntimeClient, probe_identity, query
from certagent.runtime.protocol import Identity
from tests.unit.runtime.fakehaproxy import FakeRuntimeSocket, HAProxyModel

SLOT = "/certagent/slot-00001.pem"
PEM = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


async def test_connect_switches_to_prompt_mode_and_learns_who_answers(sockdir: Path) -> None:
    model = HAProxyModel(pid=77)
    async with FakeRuntimeSocket(sockdir / "admin.sock", model) as fake:
        client = RuntimeClient(str(fake.path), timeout=1.0)
        identity = await client.connect()
        assert identity == Identity(77, 1, "2.6.12") == client.identity
        assert client.connected
        assert [args for args, _ in fake.received] == [("show", "info")]  # after `prompt`
        await client.close()
        assert not client.connected and client.identity is None


async def test_a_pipeline_is_one_write_and_its_replies_come_back_in_order(sockdir: Path) -> None:
    model = HAProxyModel()
    async with FakeRuntimeSocket(sockdir / "admin.sock", model) as fake:
        client = RuntimeClient(str(fake.path), timeout=1.0)
        await client.connect()
        replies = await client.pipeline(
            [protocol.new_cert(SLOT), protocol.set_cert(SLOT, PEM), protocol.commit_cert(SLOT)]
        )
        assert replies == [
            f"New empty certificate store '{SLOT}'!",
            f"Transaction created for certificate {SLOT}!",  # continuation prompts removed
            f"Committing {SLOT}\nSuccess!",
        ]
        assert fake.received[2] == (("set", "ssl", "cert", SLOT), PEM)  # the payload, intact
        assert model.certs[SLOT] == PEM
        assert await client.pipeline([]) == []
        assert await client.execute(protocol.set_mark("fe_sni", "a.test", 1)) == ""
        await client.close()


async def test_a_silent_haproxy_times_out_and_the_connection_is_dropped(sockdir: Path) -> None:
    async with FakeRuntimeSocket(sockdir / "admin.sock", HAProxyModel()) as fake:
        client = RuntimeClient(str(fake.path), timeout=0.2)
        await client.connect()
        fake.silent = True
        with pytest.raises(HAProxyTimeout, match="did not answer show table fe_sni"):
            await client.execute(protocol.show_marked("fe_sni"))
        assert not client.connected
        with pytest.raises(HAProxyUnavailable, match="not connected"):
            await client.execute(protocol.show_info())


async def test_a_connection_closed_mid_batch_is_unavailable(sockdir: Path) -> None:
    async with FakeRuntimeSocket(sockdir / "admin.sock", HAProxyModel()) as fake:
        client = RuntimeClient(str(fake.path), timeout=1.0)
        await client.connect()
        fake.close_after = 2  # HAProxy closes without a word (a payload over tune.bufsize)
        with pytest.raises(HAProxyUnavailable, match="connection lost"):
            await client.pipeline([protocol.new_cert(SLOT), protocol.set_cert(SLOT, PEM)])
        assert not client.connected


async def test_more_replies_than_commands_is_an_error(sockdir: Path) -> None:
    def two_prompts(args: tuple[str, ...], payload: bytes | None) -> str:
        return "Name: HAProxy\nPid: 1\n" if args == ("show", "info") else "one\n\n> two"

    async with FakeRuntimeSocket(sockdir / "admin.sock", two_prompts) as fake:
        client = RuntimeClient(str(fake.path), timeout=1.0)
        await client.connect()
        with pytest.raises(HAProxyError, match="more than 1 replies for 1 commands"):
            await client.execute(protocol.show_certs())
        await client.close()


async def test_no_socket_says_how_haproxy_must_be_configured(sockdir: Path) -> None:
    client = RuntimeClient(str(sockdir / "absent.sock"), timeout=0.5)
    with pytest.raises(HAProxyUnavailable, match="level admin"):
        await client.connect()


async def test_probe_and_query_use_a_fresh_connection_without_prompt(sockdir: Path) -> None:
    model = HAProxyModel(pid=99)
    model.certs[SLOT] = PEM
    async with FakeRuntimeSocket(sockdir / "admin.sock", model) as fake:
        assert await probe_identity(str(fake.path)) == Identity(99, 1, "2.6.12")
        reply = await query(str(fake.path), protocol.show_certs())
        assert protocol.parse_show_ssl_cert(reply).names == (SLOT,)
        assert fake.connections == 2
    with pytest.raises(HAProxyUnavailable, match="cannot connect"):
        await probe_identity(str(sockdir / "absent.sock"), timeout=0.5)
    with pytest.raises(HAProxyUnavailable, match="show ssl cert on"):
        await query(str(sockdir / "absent.sock"), protocol.show_certs(), timeout=0.5)
