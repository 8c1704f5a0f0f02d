"""Fixtures of the memory-store tests: a CA, a settable clock, the store and its roles.

A test module defining its own ``ca`` or ``store`` fixture uses that one instead.
"""

from __future__ import annotations

import pytest

from certagent.store.issuance import Issuance
from certagent.testing.certs import CA, make_ca
from tests.memstore import MemoryStore
from tests.unit.store.memroles import Clock


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
def roles(store: MemoryStore) -> Issuance:
    return store.issuance()
