"""The store's Redis connection layer without a server: HA URLs, error mapping, no I/O."""

from __future__ import annotations

import pytest
import redis.exceptions

from certagent.errors import ConfigError, StoreError, StoreUnavailable
from certagent.store import open_store, parse_store_url
from certagent.store.redis._connection import redis_errors
from certagent.store.url import parse_ha_url, redact_url, with_password, with_sentinel_password


def test_sentinel_url_parts() -> None:
    ha = parse_ha_url("redis+sentinel://ops:p%40ss@10.0.0.1:26379,[::1]:26380/mymaster/3", "x")
    assert ha.kind == "sentinel" and ha.service == "mymaster" and ha.db == 3
    assert ha.nodes == (("10.0.0.1", 26379), ("::1", 26380))
    assert (ha.username, ha.password) == ("ops", "p@ss")


def test_a_node_list_with_ipv6_nodes_passes_every_url_helper() -> None:
    # Python 3.12+ urlsplit refuses text before a '[' in the netloc ("Invalid IPv6 URL"), as
    # in a list of nodes: on Debian 13 (3.13) these raised ValueError instead of working
    nodes = "h1:26379,[2001:db8::1]:26379,[::1]:26380"
    url = f"redis+sentinel://ops:s3cret@{nodes}/mymaster?sentinel_auth=yes"
    parsed = parse_store_url(url)
    assert parsed.url == f"redis+sentinel://ops@{nodes}/mymaster?sentinel_auth=yes"
    assert parsed.password == "s3cret"
    assert redact_url(url) == url.replace(":s3cret@", ":***@")
    ha = parse_ha_url(with_password(parsed.url, "s3cret"), "x")
    assert ha.password == "s3cret" and ha.username == "ops" and ha.sentinel_auth
    assert ha.nodes == (("h1", 26379), ("2001:db8::1", 26379), ("::1", 26380))
    joined = with_sentinel_password("redis+cluster://h1:7000,[::1]:7001", "pw")
    assert joined == "redis+cluster://h1:7000,[::1]:7001?sentinel_password=pw"


def test_cluster_url_parts() -> None:
    ha = parse_ha_url("redis+cluster://h1:7000,h2:7001?password=pw", "x")
    assert ha.kind == "cluster" and ha.db == 0 and ha.service == ""
    assert ha.nodes == (("h1", 7000), ("h2", 7001)) and ha.password == "pw"


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://h1:26379",
        "redis+sentinel://h1:26379/bad name",
        "redis+sentinel://h1:26379/m/0/extra",
        "redis+sentinel://h1:99999/m",
        "redis+cluster://h1:7000/1",
        "redis+cluster://h1",
        "redis+cluster://",
    ],
)
def test_bad_ha_urls_are_config_errors_without_the_password(url: str) -> None:
    secret = url.replace("://", "://:hunter2@", 1)
    with pytest.raises(ConfigError) as caught:
        parse_store_url(secret)
    assert "hunter2" not in str(caught.value)


def test_passwords_are_redacted_and_kept_apart() -> None:
    url = "redis+cluster://admin:hunter2@h1:7000,h2:7001"
    assert redact_url(url) == "redis+cluster://admin:***@h1:7000,h2:7001"
    parsed = parse_store_url(url)
    assert parsed.password == "hunter2" and "hunter2" not in parsed.url
    store = open_store(url)
    assert "hunter2" not in store.describe()


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (redis.exceptions.ConnectionError("refused"), StoreUnavailable),
        (redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"), StoreUnavailable),
        (redis.exceptions.TryAgainError("TRYAGAIN"), StoreUnavailable),
        (redis.exceptions.MovedError("3999 127.0.0.1:6381"), StoreUnavailable),
        (redis.exceptions.SlotNotCoveredError("slot 12 not covered"), StoreUnavailable),
        (redis.exceptions.MaxConnectionsError("too many"), StoreUnavailable),
        (redis.exceptions.ClusterCrossSlotError("CROSSSLOT"), StoreError),
        (redis.exceptions.RedisClusterException("no nodes"), StoreError),
        (redis.exceptions.ResponseError("WRONGTYPE"), StoreError),
        # uvloop, writing on a connection a failover closed (seen in the Sentinel test)
        (
            RuntimeError(
                "unable to perform operation on <TCPTransport closed=True reading=False"
                " 0x55e8128dd6c0>; the handler is closed"
            ),
            StoreUnavailable,
        ),
    ],
)
def test_redis_errors_become_ours(error: Exception, kind: type[Exception]) -> None:
    with pytest.raises(kind) as caught, redis_errors("redis+cluster://h1:7000", "lookup"):
        raise error
    assert type(caught.value) is kind
    assert caught.value.__cause__ is error


def test_sentinel_auth_is_yes_or_no_and_only_for_sentinel() -> None:
    base = "redis+sentinel://:pw@h1:26379,h2:26379/mymaster"
    assert parse_ha_url(base, "x").sentinel_auth is False
    assert parse_ha_url(base + "?sentinel_auth=yes", "x").sentinel_auth is True
    assert parse_ha_url(base + "?sentinel_auth=no", "x").sentinel_auth is False
    with pytest.raises(ConfigError, match="sentinel_auth is yes or no"):
        parse_store_url(base + "?sentinel_auth=maybe")
    with pytest.raises(ConfigError, match="for redis\\+sentinel"):
        parse_store_url("redis+cluster://h1:7000?sentinel_auth=yes")
    parsed = parse_store_url(base + "?sentinel_auth=yes")
    assert parsed.password == "pw" and parsed.url.endswith("/mymaster?sentinel_auth=yes")


def test_the_sentinels_own_password_is_kept_apart_and_redacted() -> None:
    base = "redis+sentinel://:data-pw@h1:26379,h2:26379/mymaster"
    ha = parse_ha_url(base + "?sentinel_password=s%26pw&sentinel_username=watcher", "x")
    assert (ha.username, ha.password) == (None, "data-pw")
    assert (ha.sentinel_username, ha.sentinel_password) == ("watcher", "s&pw")
    assert ha.sentinel_auth is False
    # init's view: both passwords out of the URL that goes into certagent.toml
    parsed = parse_store_url(base + "/0?sentinel_password=s%26pw&sentinel_username=watcher")
    assert (parsed.password, parsed.sentinel_password) == ("data-pw", "s&pw")
    assert parsed.url == "redis+sentinel://h1:26379,h2:26379/mymaster/0?sentinel_username=watcher"
    assert redact_url(base + "?sentinel_password=s%26pw") == (
        "redis+sentinel://:***@h1:26379,h2:26379/mymaster?sentinel_password=***"
    )
    with pytest.raises(ConfigError, match="not both"):
        parse_store_url(base + "?sentinel_auth=yes&sentinel_password=x")
    for other in ("redis+cluster://h1:7000", "redis://h1:6379/0"):
        with pytest.raises(ConfigError, match="for redis\\+sentinel") as caught:
            parse_store_url(other + "?sentinel_password=hidden")
        assert "hidden" not in str(caught.value)


def test_no_master_is_one_line_that_says_what_to_do() -> None:
    from redis.asyncio.sentinel import MasterNotFoundError

    said = (
        "No master found for 'certagent' : <redis.asyncio.client.Redis(<...password=<REDACTED>"
        ",...)>)> - auth:AuthenticationError, <redis.asyncio.client.Redis(<...>)> - "
        "auth:AuthenticationError, <redis.asyncio.client.Redis(<...>)> - timeout:TimeoutError"
    )
    plain = "redis+sentinel://h1:26379/certagent"
    with pytest.raises(StoreUnavailable) as caught, redis_errors(plain, "ping"):
        raise MasterNotFoundError(said)
    text = str(caught.value)
    assert "Redis(" not in text and "\n" not in text
    assert "service 'certagent'" in text and "2 x AuthenticationError, 1 x TimeoutError" in text
    assert "add ?sentinel_auth=yes" in text
    refused = pytest.raises(StoreUnavailable, match="refused the store's user and password")
    with refused, redis_errors(plain + "?sentinel_auth=yes", "ping"):
        raise MasterNotFoundError(said)
    own = pytest.raises(StoreUnavailable, match="refused their password")
    with own, redis_errors(plain + "?sentinel_password=***", "ping"):
        raise MasterNotFoundError(said)
    unknown = pytest.raises(StoreUnavailable, match="check the sentinel addresses")
    with unknown, redis_errors(plain, "ping"):
        raise MasterNotFoundError("No master found for 'certagent' : ")


def test_other_runtime_errors_are_not_taken_for_a_store_outage() -> None:
    with pytest.raises(RuntimeError, match="Event loop is closed"), redis_errors("redis://h", "x"):
        raise RuntimeError("Event loop is closed")
