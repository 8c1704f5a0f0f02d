"""The HA harness starts even when a port it chose is taken before its node binds it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from certagent.testing import RedisProcess, processes
from certagent.testing.redisha import ClusterSet, SentinelSet

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", [ClusterSet, SentinelSet])
def test_a_port_taken_after_it_was_chosen_means_fresh_ports_not_a_failed_start(
    kind: type[ClusterSet] | type[SentinelSet], tmp_path: Path
) -> None:
    ha = kind(tmp_path / "ha")
    taken = ha.nodes[-1].port
    # bound, not listening: what another connection's ephemeral port does in a full test run
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        with ha:
            assert taken not in [n.port for n in ha.nodes]
            with ha.nodes[0].client() as client:
                assert client.ping()


def test_a_single_redis_also_moves_to_a_fresh_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        taken = squatter.getsockname()[1]
        ports = iter([taken, processes.free_port()])
        monkeypatch.setattr(processes, "free_port", lambda: next(ports))
        redis = RedisProcess(tmp_path / "redis").start()
        try:
            assert redis.port != taken
            with redis.client() as client:
                assert client.ping()
        finally:
            redis.stop()
