"""Scoped tokens against the real agent (``certagent run``), Redis and HAProxy.

``test_authorization_matrix`` sends every route that needs a token, with a token
of every scope held to ``*.in.test``, about a name inside and one outside the
pattern, and checks each status (and problem code) against one rule: the scope
first (403 ``forbidden``), then the names (a read outside: 404 as if missing, or
a list without it; a write outside: 403 ``forbidden-name``).  Every one of those
requests, and the setup's, must have left exactly one audit line, in order, with
its token name and outcome; the whole log must hold no token, hash or key.

``test_a_customer_panel_token`` is issue 30's scenario: a ``domains`` token for
``*.customer.test`` made with ``certagent token add``, a ``read`` token that lists
only its names, and a token past ``--expires``.

The agent has an ACME directory configured (never contacted: renewal is off on
this node and no name it lacks is asked for), so ``PUT /v1/renewals/{name}``
really schedules.  One stack for the module: ≈10 s in all.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509

from certagent.api.auth import add_token, hash_token
from certagent.api.grants import make_grant
from certagent.testing import PKI, RedisFixture, Stack, certagent_argv, free_port
from certagent.testing.certs import key_pem, shared_key
from certagent.testing.ocsp import ocsp_response
from tests.integration.apiagent import (
    Answer,
    Audited,
    audit_lines,
    call,
    secrets_of_pem,
    unsafe_lines,
)

pytestmark = pytest.mark.integration

SCOPES = ("read", "certificates", "domains", "renewals", "admin")
SIDES = ("in", "out")
CERTS = "/v1/certificates"
CERT = "/v1/certificates/{id}"
OCSP = "/v1/certificates/{id}/ocsp"
DOMAINS = "/v1/domains"
DOMAIN = "/v1/domains/{name}"
LOADED = "/v1/loaded"
RENEWAL = "/v1/renewals/{name}"
PUBLIC = ("/healthz", "/readyz", "/metrics", "/v1/openapi.json")


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    scope: str
    ok: int  # the status of a request inside the token's scope and names

    @property
    def lists(self) -> bool:
        return self.template in (CERTS, DOMAINS, LOADED) and self.method == "GET"


ROUTES = (
    Route("GET", CERTS, "read", 200),
    Route("POST", CERTS, "certificates", 201),
    Route("GET", CERT, "read", 200),
    Route("PUT", CERT, "certificates", 200),
    Route("DELETE", CERT, "certificates", 204),
    Route("PUT", OCSP, "certificates", 200),
    Route("GET", LOADED, "read", 200),
    Route("GET", DOMAINS, "read", 200),
    Route("POST", DOMAINS, "domains", 201),
    Route("GET", DOMAIN, "read", 200),
    Route("DELETE", DOMAIN, "domains", 204),
    Route("PUT", RENEWAL, "renewals", 200),
)


def expected(route: Route, scope: str, side: str) -> tuple[int, str | None]:
    """The rule under test: scope first, then names (reads: as missing; writes: 403)."""
    if scope not in (route.scope, "admin"):
        return 403, "forbidden"
    if side == "in":
        return route.ok, None
    if route.method == "GET":
        return (200, None) if route.lists else (404, "not-found")
    return 403, "forbidden-name"


@dataclass
class Agent:
    stack: Stack
    pki: PKI
    tokens: Path
    root: tuple[str, str]  # a token written as before scopes: admin on every name
    base: str
    key_file: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*certagent_argv(), *args], capture_output=True, text=True, timeout=30, check=False
        )

    def upload(self, api: Audited, name: str) -> tuple[str, bytes]:
        """Store a certificate for ``name`` with the root token: its id and its chain."""
        chain, key = self.pki.chain_and_key(name)
        answer = api.call(self.root, "POST", CERTS, CERTS, json_body=pem(chain, key))
        assert answer.status == 201, answer.body
        return answer.body["id"], chain

    def secrets(self) -> list[str]:
        """Everything no log line may hold: every token of the file, its hash, every key."""
        found = [line for line in self.key_file.read_text().splitlines() if line]
        found += secrets_of_pem(key_pem(shared_key()))
        return found


def pem(chain: bytes, key: bytes) -> dict[str, str]:
    return {"chain": chain.decode(), "key": key.decode()}


@pytest.fixture(scope="module")
def agent(
    redis_server: str, key_file: Path, pki: PKI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Agent]:
    RedisFixture(redis_server, key_file).flushall()
    where = tmp_path_factory.mktemp("scopes")
    tokens = where / "api-tokens"
    root = ("root", add_token(tokens, "root"))
    port = free_port()
    stack = Stack.create(
        where / "stack",
        store=redis_server,
        cafile=pki.cafile,
        key_file=key_file,
        capacity=20,
        env={
            "CERTAGENT_LOG_LEVEL": "debug",
            "CERTAGENT_API_TOKENS_FILE": str(tokens),
            "CERTAGENT_API_BIND": f"127.0.0.1:{port}",
            "CERTAGENT_ACME_ALLOW_SUFFIXES": "in.test out.test customer.test other.test",
            "CERTAGENT_RENEW_TICK": "0",
        },
        init_args=[
            "--acme-directory", "https://127.0.0.1:9/directory",
            "--http-bind", f"127.0.0.1:{free_port()}",
        ],
    )  # fmt: skip
    try:
        stack.start_haproxy()
        stack.start_agent()
        yield Agent(stack, pki, tokens, root, f"http://127.0.0.1:{port}", key_file)
    except BaseException:
        print(stack.log_tails())
        raise
    finally:
        stack.close()


def run_case(agent: Agent, api: Audited, route: Route, token: tuple[str, str], name: str) -> Answer:
    """Prepare what the request acts on (with the root token), then send it with ``token``."""
    method, template = route.method, route.template
    if template in (CERTS, DOMAINS, LOADED) and method == "GET":
        return api.call(
            token, "GET", template + ("?limit=500" if template != LOADED else ""), template
        )
    if template == CERTS:
        return api.call(token, method, CERTS, CERTS, json_body=pem(*agent.pki.chain_and_key(name)))
    if template in (CERT, OCSP):
        cert_id, chain = agent.upload(api, name)
        if template == OCSP:
            leaf = x509.load_pem_x509_certificate(chain)
            der = ocsp_response(agent.pki.ca, leaf)
            return api.call(
                token, method, f"{CERTS}/{cert_id}/ocsp", OCSP,
                data=der, content_type="application/ocsp-response",
            )  # fmt: skip
        body = pem(*agent.pki.chain_and_key(name)) if method == "PUT" else None
        return api.call(token, method, f"{CERTS}/{cert_id}", CERT, json_body=body)
    if template == DOMAINS:
        return api.call(token, "POST", DOMAINS, DOMAINS, json_body={"name": name})
    if template == DOMAIN:
        assert (
            api.call(agent.root, "POST", DOMAINS, DOMAINS, json_body={"name": name}).status == 201
        )
        return api.call(token, method, f"{DOMAINS}/{name}", DOMAIN)
    assert template == RENEWAL
    return api.call(token, "PUT", f"/v1/renewals/r.{name.rsplit('.', 2)[1]}.test", RENEWAL)


def test_authorization_matrix(agent: Agent) -> None:
    api = Audited(agent.base)
    since = len(audit_lines(agent.stack))
    now = datetime.now(UTC)
    tokens = {
        scope: (
            scope,
            add_token(
                agent.tokens, scope, make_grant(scopes=[scope], names=["*.in.test"], now=now)
            ),
        )
        for scope in SCOPES
    }
    listed: dict[str, str] = {}
    for side in SIDES:
        listed[side], _ = agent.upload(api, f"l.{side}.test")
        assert (
            api.call(
                agent.root, "POST", DOMAINS, DOMAINS, json_body={"name": f"l.{side}.test"}
            ).status
            == 201
        )
        agent.upload(api, f"r.{side}.test")
        assert agent.stack.handshake(f"l.{side}.test").san == (f"l.{side}.test",)  # loaded

    numbers = itertools.count()
    wrong = []
    for route in ROUTES:
        for scope in SCOPES:
            for side in SIDES:
                name = f"n{next(numbers)}.{side}.test"
                answer = run_case(agent, api, route, tokens[scope], name)
                want = expected(route, scope, side)
                case = f"{route.method} {route.template} {scope} {side}"
                if (answer.status, answer.code) != want:
                    wrong.append(f"{case}: {answer.status} {answer.code}, expected {want}")
                    continue
                if want[1] == "forbidden":
                    assert answer.body["scope"] == route.scope, case
                if route.lists and answer.status == 200:
                    shown = json.dumps(answer.body["items"])
                    assert (
                        "l.in.test" in shown or listed["in"] in shown
                    ) and "l.out.test" not in shown, (case, shown)
    assert wrong == [], "\n".join(wrong)

    # what needs no token answers every token, and nobody
    for path in PUBLIC:
        for token in (None, *tokens.values()):
            assert call(agent.base + path, "GET", token=token and token[1]).status == 200, path
    # no token, an unknown one, one over its rate
    assert api.call(None, "GET", CERTS, CERTS).code == "missing-token"
    assert api.call(("?", "cat_" + "x" * 43), "GET", CERTS, CERTS).code == "bad-token"
    burst = ("burst", add_token(agent.tokens, "burst", make_grant(rate="1/m", now=now)))
    assert api.call(burst, "GET", CERTS, CERTS).status == 200
    limited = api.call(burst, "GET", CERTS, CERTS)
    assert (limited.status, limited.code) == (429, "rate-limited")
    assert 1 <= int(limited.headers["Retry-After"]) <= 60

    # one audit line per request, in order, with its token and outcome
    api.check(agent.stack, since)
    # /metrics counts them by token and outcome
    metrics = call(agent.base + "/metrics", "GET").body
    for scope in SCOPES:
        accepted = sum(1 for t, _, _, status in api.expected if t == scope and status < 400)
        assert (
            f'certagent_api_requests_total{{outcome="accepted",token="{scope}"}} {accepted}.0'
            in metrics
        )
    # no token, hash or key anywhere in the agent's log or HAProxy's
    secrets = agent.secrets()
    for _, secret in (agent.root, burst, *tokens.values()):
        secrets += [secret, hash_token(secret)]
    log = agent.stack.agent_log() + agent.stack.haproxy_log()
    assert unsafe_lines(log, secrets) == []


def test_a_customer_panel_token(agent: Agent) -> None:
    """Issue 30's case: made with ``certagent token add``, as an operator would."""
    since = len(audit_lines(agent.stack))
    api = Audited(agent.base)
    tokens = str(agent.tokens)

    def token_add(name: str, *options: str) -> tuple[str, str]:
        made = agent.cli("token", "add", name, "--file", tokens, *options)
        assert made.returncode == 0, made.stderr
        return name, made.stdout.strip()

    panel = token_add("panel", "--scope", "domains", "--names", "*.customer.test")
    reader = token_add("monitor", "--scope", "read", "--names", "*.customer.test")
    late = token_add("late", "--expires", "1s")

    answer = api.call(panel, "POST", DOMAINS, DOMAINS, json_body={"name": "a.customer.test"})
    assert answer.status == 201, answer.body
    answer = api.call(panel, "POST", DOMAINS, DOMAINS, json_body={"name": "b.other.test"})
    assert (answer.status, answer.code) == (403, "forbidden-name")
    upload = pem(*agent.pki.chain_and_key("shop.customer.test"))
    answer = api.call(panel, "POST", CERTS, CERTS, json_body=upload)
    assert (answer.status, answer.code, answer.body["scope"]) == (403, "forbidden", "certificates")

    mine, _ = agent.upload(api, "s.customer.test")
    theirs, _ = agent.upload(api, "s.other.test")
    assert (
        api.call(agent.root, "POST", DOMAINS, DOMAINS, json_body={"name": "b.other.test"}).status
        == 201
    )
    answer = api.call(reader, "GET", CERTS + "?limit=500", CERTS)
    ids = [item["id"] for item in answer.body["items"]]
    assert mine in ids and theirs not in ids
    assert all(n.endswith(".customer.test") for i in answer.body["items"] for n in i["names"])
    answer = api.call(reader, "GET", DOMAINS, DOMAINS)
    assert [d["name"] for d in answer.body["items"]] == ["a.customer.test"]

    listed = agent.cli("token", "ls", "--file", tokens, "--json")
    (expiry,) = [
        json.loads(line)["expires"] for line in listed.stdout.splitlines() if '"late"' in line
    ]
    until = datetime.fromisoformat(expiry).timestamp()
    time.sleep(max(0.0, until - time.time() + 0.05))
    answer = api.call(late, "GET", CERTS, CERTS)
    assert (answer.status, answer.code) == (401, "expired-token")

    lines = api.check(agent.stack, since)
    outcomes = [(a["token"], a["outcome"]) for a in lines][:3]
    assert outcomes == [("panel", "accepted"), ("panel", "refused"), ("panel", "refused")]
    assert lines[1]["names"] == ["b.other.test"] and lines[0]["names"] == ["a.customer.test"]
    secrets = agent.secrets()
    for _, secret in (panel, reader, late):
        secrets += [secret, hash_token(secret)]
    assert unsafe_lines(agent.stack.agent_log(), secrets) == []
