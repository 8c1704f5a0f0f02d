"""The Docker checks run only in their own step: ``CERTAGENT_DOCKER_STEP=1``.

``scripts/docker-test.sh`` (``scripts/test.sh``'s Docker step) sets it once
``scripts/docker-engine.sh`` has an engine running; every other pytest run (the version
matrix, the canary) skips these tests with the reason, whatever ``CERTAGENT_TEST_DOCKER``
says, so a run without Docker neither fails nor waits on a build.
"""

from __future__ import annotations

import os

import pytest

from tests.docker.compose import engine_answers


@pytest.fixture(scope="session", autouse=True)
def _docker_checks_asked_for() -> None:
    if os.environ.get("CERTAGENT_DOCKER_STEP") != "1":
        pytest.skip("the Docker checks run in scripts/test.sh's Docker step (docker-test.sh)")
    why = engine_answers()
    if why is not None:
        pytest.fail(f"the Docker step runs, but no Docker engine answers ({why})")
