"""What HAProxy build runs: parsing ``haproxy -vv``, ``show dev`` and ``show libs`` (recorded)."""

from __future__ import annotations

import pytest

from certagent.errors import HAProxyError
from certagent.runtime.build import (
    HAProxyBuild,
    differences,
    executable_from_libs,
    http3_problem,
    parse_build,
)

# haproxy -vv of Debian 12's 2.6.12 (excerpt)
VV_26 = """\
HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/
Status: long-term supported branch - will stop receiving fixes around Q2 2027.
Feature list : +EPOLL -KQUEUE +LUA +OPENSSL -QUIC +TFO
Built with OpenSSL version : OpenSSL 3.0.17 1 Jul 2025
Running on OpenSSL version : OpenSSL 3.0.19 27 Jan 2026
OpenSSL library supports TLS extensions : yes
Built with Lua version : Lua 5.3.6
"""
# show dev of Debian 13's 3.0.11 (excerpt)
SHOW_DEV_30 = """\
HAProxy version 3.0.11-1+deb13u4
Features
  -51DEGREES +ACCEPT4 +BACKTRACE +QUIC +QUIC_OPENSSL_COMPAT +RT
Build options
  Built with OpenSSL version : OpenSSL 3.5.7 9 Jun 2026
  Running on OpenSSL version : OpenSSL 3.5.9 29 Sep 2026
  Built with Lua version : Lua 5.4.7
"""
# haproxy -vv of Debian sid's 3.2.26 (excerpt): "SSL library" instead of "OpenSSL"
VV_32 = """\
HAProxy version 3.2.26-1 2026/10/14 - https://haproxy.org/
Feature list : -51DEGREES +ACCEPT4 +QUIC -QUIC_OPENSSL_COMPAT +RT +SSL +ACME
Built with SSL library version : OpenSSL 3.6.5 29 Sep 2026
Running on SSL library version : OpenSSL 3.6.5 29 Sep 2026
SSL library supports TLS extensions : yes
Built with Lua version : Lua 5.4.9
"""
# show dev of Debian experimental's 3.4.7 (excerpt): the section titles end in ':'
SHOW_DEV_34 = """\
HAProxy version 3.4.7-1
Features:
  -51DEGREES +ACCEPT4 +KTLS +QUIC -QUIC_OPENSSL_COMPAT +RT +ACME +HAVE_TCP_MD5SIG
Build options:
  Built with SSL library version : OpenSSL 3.6.5 29 Sep 2026
  Running on SSL library version : OpenSSL 3.6.5 29 Sep 2026
  Built with Lua version : Lua 5.4.9
"""
SHOW_LIBS_26 = """\
0x55c05818b000-0x55c05853f277 (0x03b4278) /usr/sbin/haproxy
0x7fa926b11000-0x7fa926b4c2a7 (0x003b2a8) /lib/x86_64-linux-gnu/libcrypt.so.1
"""


@pytest.mark.parametrize(
    ("text", "version", "openssl", "lua", "branch", "pq"),
    [
        (VV_26, "2.6.12-1+deb12u4", "OpenSSL 3.0.19 27 Jan 2026", "Lua 5.3.6", (2, 6), False),
        (SHOW_DEV_30, "3.0.11-1+deb13u4", "OpenSSL 3.5.9 29 Sep 2026", "Lua 5.4.7", (3, 0), True),
        (VV_32, "3.2.26-1", "OpenSSL 3.6.5 29 Sep 2026", "Lua 5.4.9", (3, 2), True),
    ],
)
def test_parse_build_takes_the_library_it_runs_on(
    text: str, version: str, openssl: str, lua: str, branch: tuple[int, int], pq: bool
) -> None:
    build = parse_build(text)
    assert (build.version, build.openssl, build.lua) == (version, openssl, lua)
    assert build.branch == branch
    assert build.post_quantum is pq
    assert build.describe() == f"HAProxy {version}, {' '.join(openssl.split()[:2])}, {lua}"
    assert build.as_dict()["differences"] == differences(build)


def test_the_version_from_show_info_wins_and_a_text_without_one_is_refused() -> None:
    assert parse_build(VV_26, "2.6.12").version == "2.6.12"
    with pytest.raises(HAProxyError, match="no HAProxy version"):
        parse_build("Unknown command\n")
    unknown = parse_build("Unknown command\n", "2.6.12")
    assert (unknown.openssl, unknown.lua, unknown.post_quantum) == (None, None, None)
    assert unknown.describe() == "HAProxy 2.6.12, TLS library unknown, Lua unknown"


def test_a_library_that_is_not_openssl_has_no_openssl_version() -> None:
    build = HAProxyBuild("3.2.0", "AWS-LC 1.50.0", "Lua 5.4.7")
    assert build.openssl_version is None
    assert build.post_quantum is None


def test_executable_from_show_libs() -> None:
    assert executable_from_libs(SHOW_LIBS_26) == "/usr/sbin/haproxy"
    assert executable_from_libs("Unknown command\n") is None


def test_differences_name_the_version_specific_behaviour() -> None:
    old = differences(parse_build(VV_26))
    new = differences(parse_build(VV_32))
    assert any("leaks" in line for line in old)
    assert any("no longer leaks" in line for line in new)
    assert any("no X25519MLKEM768" in line for line in old)
    assert any("X25519MLKEM768 offered first" in line for line in new)
    assert any("bool-sample-conversion" in line for line in new)
    on_30 = differences(parse_build(SHOW_DEV_30))
    assert not any("bool-sample-conversion" in line for line in on_30)


@pytest.mark.parametrize(
    ("text", "quic", "limited", "problem"),
    [
        (VV_26, False, False, "HAProxy 2.6.12-1+deb12u4 (/usr/sbin/haproxy) cannot serve"),
        (SHOW_DEV_30, True, True, None),
        (VV_32, True, False, None),
        (SHOW_DEV_34, True, False, None),
    ],
)
def test_quic_comes_from_the_feature_list(
    text: str, quic: bool, limited: bool, problem: str | None
) -> None:
    build = parse_build(text)
    assert build.quic is quic
    assert build.limited_quic is limited
    assert build.as_dict()["quic"] is quic
    found = http3_problem(build, "/usr/sbin/haproxy")
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)
        assert "3.0 or later built with QUIC" in found


def test_http3_needs_a_known_quic_build_of_3_0_or_later() -> None:
    assert parse_build("HAProxy version 3.2.0\n").quic is None  # no feature list
    unknown = http3_problem(HAProxyBuild("3.2.0", None, None))
    assert unknown is not None and "cannot tell" in unknown
    without = http3_problem(HAProxyBuild("3.2.0", None, None, frozenset({"LUA", "OPENSSL"})))
    assert without is not None and "built without QUIC" in without
    old = http3_problem(HAProxyBuild("2.8.5", None, None, frozenset({"QUIC"})))
    assert old is not None and "HAProxy 2.8.5 cannot serve" in old


def test_differences_say_how_quic_runs() -> None:
    assert not any("HTTP/3" in line for line in differences(parse_build(VV_26)))
    assert any("limited-quic" in line for line in differences(parse_build(SHOW_DEV_30)))
    assert any("own QUIC support" in line for line in differences(parse_build(VV_32)))
