"""The Docker checks run only where asked: ``CERTAGENT_TEST_DOCKER=1``.

``scripts/test.sh``'s compose step sets it, with an engine from
``scripts/docker-engine.sh``; every other pytest run (the version matrix) skips these
tests with the reason, so a run without Docker neither fails nor waits on a build.
"""

from __future__ import annotations

import os

import pytest

from tests.docker.compose import engine_answers


@pytest.fixture(scope="session", autouse=True)
def _docker_checks_asked_for() -> None:
    if not os.environ.get("CERTAGENT_TEST_DOCKER"):
        pytest.skip(
            "the Docker checks run in scripts/test.sh's compose step (CERTAGENT_TEST_DOCKER=1)"
        )
    why = engine_answers()
    if why is not None:
        pytest.fail(f"CERTAGENT_TEST_DOCKER is set but no Docker engine answers ({why})")
