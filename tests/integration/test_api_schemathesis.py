"""schemathesis against the REST API on a real Redis: the OpenAPI document says what the API does.

The API runs here (``start_api``, a RedisStore on the session's private
redis-server) with one ``admin`` token (a line without scopes: every operation,
every name; tests/integration/test_api_scopes.py checks the other scopes);
schemathesis's CLI runs in a subprocess against ``/v1/openapi.json`` with
every check (``--checks all``), every phase (examples, coverage, fuzzing,
stateful), a fixed number of examples per operation and deterministic
generation, so each run sends the same requests.  Settings:
``schemathesis.toml``; one extra check: ``schemathesis_hooks.py``.

A failure prints schemathesis's report: each failing request with a curl line to
replay it.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from certagent.certs.pem import parse_bundle
from certagent.service.manage import manage_name
from certagent.service.permission import Permission
from certagent.service.renewtime import RenewPolicy
from certagent.store.base import Store
from certagent.store.renewals import Managed
from certagent.testing.certs import CA, issue, make_ca
from tests.apihelp import listening_api
from tests.integration.conftest import RedisFixture

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
CONFIG = HERE / "schemathesis.toml"
HOOKS = HERE / "schemathesis_hooks.py"
#: Test cases per operation and phase: about 2,000 requests, 10-20 s on this machine.
MAX_EXAMPLES = 100
RUN_TIMEOUT = 100.0  # seconds; pytest's own timeout is 120


@dataclass
class Served:
    url: str
    token: str
    kept_id: str  # GET and PUT get it for half their {id} values
    doomed_id: str  # so does DELETE
    renewals: Renewals  # what PUT /v1/renewals/{name} scheduled


@dataclass
class Renewals:
    """``PUT /v1/renewals/{name}`` as on an agent with an ACME CA: names under example.test
    are allowed (the stored ones are reached through the links schemathesis infers from the
    certificates' names)."""

    managed: list[str] = field(default_factory=list)

    def __call__(self, store: Store) -> Callable[[str], Awaitable[Managed]]:
        async def manage(name: str) -> Managed:
            done = await manage_name(
                store, Permission(suffixes=("example.test",)), RenewPolicy(), name
            )
            self.managed.append(done.name)
            return done

        return manage


@pytest.fixture
async def served(redis_store: RedisFixture, tmp_path: Path) -> AsyncIterator[Served]:
    renewals = Renewals()
    async with listening_api(
        redis_store.url, redis_store.key_file, tmp_path, manage=renewals
    ) as api:
        ca: CA = make_ca("schemathesis CA")
        kept = await api.store.add(parse_bundle(*issue(ca, "kept.example.test")))
        doomed = await api.store.add(parse_bundle(*issue(ca, "doomed.example.test")))
        yield Served(api.server.url, api.token, kept.id, doomed.id, renewals)


def _config(served: Served, workdir: Path) -> Path:
    """schemathesis.toml, plus stored certificates' ids for half of the ``{id}`` values.

    Without them every generated id is unknown (404) and reading, rotating and
    deleting a stored certificate would go untested. DELETE gets its own record,
    so GET and PUT keep theirs.
    """
    config = workdir / "schemathesis.toml"
    lines = [CONFIG.read_text()]
    for name, cert_id, methods in (
        ("kept", served.kept_id, '["GET", "PUT"]'),
        ("doomed", served.doomed_id, '["DELETE"]'),
    ):
        lines += [
            f'[dictionaries.{name}]\nvalues = ["{cert_id}"]\n',
            "[[operations]]",
            'include-path = "/v1/certificates/{id}"',
            f"include-method = {methods}",
            f'parameters = {{ "path.id" = {{ dictionary = "{name}", probability = 0.5 }} }}\n',
        ]
    config.write_text("\n".join(lines))
    return config


async def _run_schemathesis(served: Served, workdir: Path) -> tuple[int, str, Path]:
    junit = workdir / "junit.xml"
    argv = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(_config(served, workdir)),
        "run",
        f"{served.url}/v1/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--generation-deterministic",
        "--workers",
        "1",
        "--no-color",
        "--report",
        "junit",
        "--report-junit-path",
        str(junit),
    ]
    env = {
        **os.environ,
        "CERTAGENT_SCHEMATHESIS_TOKEN": served.token,
        "SCHEMATHESIS_HOOKS": str(HOOKS),
        "NO_COLOR": "1",
    }
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=workdir,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), junit


async def test_schemathesis_finds_no_failure(served: Served, tmp_path: Path) -> None:
    status, report, junit = await _run_schemathesis(served, tmp_path)
    assert status == 0, report[-12_000:]
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None, report[-2_000:]
    assert int(suite.get("tests", "0")) >= 8, report[-2_000:]
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0"), report[-12_000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", report)
    assert counts is not None, report[-2_000:]
    assert int(counts[1]) == int(counts[2]) > 500, report[-2_000:]
    # the renewal route scheduled stored names, not only refused others
    assert {"kept.example.test", "doomed.example.test"} & set(served.renewals.managed)
