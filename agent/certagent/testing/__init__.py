"""The process harness: real Redis, HAProxy and ``certagent run`` on loopback.

Shared by the integration tests (``tests/integration/conftest.py`` wraps it in
fixtures), the demo (``demo/``) and the benchmarks (``bench/``), so it lives in
the package and never imports the test tree.  Not used by the agent itself.

* :mod:`~certagent.testing.processes`: ``redis-server`` and ``haproxy`` processes,
  free ports, bounded waits, stopping by PID;
* :mod:`~certagent.testing.redisha`: a Sentinel set (1 master, 1 replica, 3
  sentinels) and a 3-master Redis Cluster, with a master killed by PID on demand;
* :mod:`~certagent.testing.fixtures`: a test CA and Redis stores with a data key;
* :mod:`~certagent.testing.stack`: one ``certagent init`` directory with its
  HAProxy and agent (:class:`Stack`), and a background prober;
* :mod:`~certagent.testing.certs`: certificate factories, odd keys included;
* :mod:`~certagent.testing.tlsclient`: verified TLS handshakes and raw ClientHellos.
"""

from certagent.testing import tlsclient
from certagent.testing.fixtures import PKI, RedisFixture, write_key_file
from certagent.testing.processes import (
    HAPROXY,
    REDIS_SERVER,
    SLOT_PREFIX,
    HAProxyProcess,
    RedisProcess,
    StackError,
    certagent_argv,
    cli_start_seconds,
    cpu_seconds,
    free_port,
    haproxy_build,
    pid_alive,
    rss_kb,
    stop_process,
    tail,
    unix_request,
    wait_for,
)
from certagent.testing.redisha import ClusterSet, SentinelSet
from certagent.testing.stack import Prober, Stack

__all__ = [
    "HAPROXY",
    "PKI",
    "REDIS_SERVER",
    "SLOT_PREFIX",
    "ClusterSet",
    "HAProxyProcess",
    "Prober",
    "RedisFixture",
    "RedisProcess",
    "SentinelSet",
    "Stack",
    "StackError",
    "certagent_argv",
    "cli_start_seconds",
    "cpu_seconds",
    "free_port",
    "haproxy_build",
    "pid_alive",
    "rss_kb",
    "stop_process",
    "tail",
    "tlsclient",
    "unix_request",
    "wait_for",
    "write_key_file",
]
