"""Finding HAProxy's master to reload it (the only safe way out of a broken transaction)."""

from __future__ import annotations

import asyncio
import os

import pytest

from certagent.errors import HAProxyError
from certagent.runtime.recover import graceful_reload, master_of


def test_a_process_whose_parent_is_not_haproxy_has_no_master() -> None:
    with pytest.raises(HAProxyError, match=r"master-worker mode \(-W\)"):
        master_of(os.getpid())
    with pytest.raises(HAProxyError, match="master-worker mode"):
        asyncio.run(graceful_reload(os.getpid()))  # and nothing is signalled


def test_a_vanished_worker_says_so() -> None:
    with pytest.raises(HAProxyError, match="cannot find the master of HAProxy worker"):
        master_of(2**22 + 12345)
