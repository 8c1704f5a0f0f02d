"""``show stat <frontend> 1 -1``: fe_tls's QUIC counters (recorded replies of 2.6 and 3.2)."""

from __future__ import annotations

import pytest

from certagent.errors import CommandFailed
from certagent.runtime import protocol

# HAProxy 3.2.26, fe_tls after one refused QUIC handshake (aioquic closes in two packets)
# and one HTTP/3 request; the columns are cut to those that matter here and a few others.
SHOW_STAT_32 = (
    "# pxname,svname,scur,stot,h3sess,h3req,proto,-,ssl_sess,quic_hdshk_fail,"
    "quic_transp_err_no_error,quic_transp_err_crypto_error,quic_transp_err_unknown_error\n"
    "fe_tls,FRONTEND,0,6,1,1,,-,2,0,0,2,0\n\n"
)
# HAProxy 2.6.12 (no QUIC module): no quic_* column
SHOW_STAT_26 = "# pxname,svname,scur,stot,ssl_sess\nfe_tls,FRONTEND,0,6,2\n\n"


def test_the_command_asks_for_one_frontend_line() -> None:
    assert protocol.show_frontend_stats("fe_tls").encode() == b"show stat fe_tls 1 -1\n"


def test_quic_counters_are_read_by_column_name() -> None:
    counters = protocol.parse_quic_counters(SHOW_STAT_32)
    assert counters == protocol.QuicCounters(refused=2, failed=0, connections=1, requests=1)


def test_a_build_without_quic_has_no_counters() -> None:
    assert protocol.parse_quic_counters(SHOW_STAT_26) is None


@pytest.mark.parametrize("reply", ["No such proxy.\n", "", "# pxname,svname\nbe_app,BACKEND\n"])
def test_anything_but_a_frontend_line_is_refused(reply: str) -> None:
    with pytest.raises(CommandFailed):
        protocol.parse_quic_counters(reply)
