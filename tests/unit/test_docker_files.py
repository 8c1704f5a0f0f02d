"""The container files, read as Docker and Compose would (no engine on the test machines).

The entrypoint itself runs in tests/integration/test_docker_entrypoint.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")
    ))  # fmt: skip
    found = []
    for line in logical.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def test_the_image_runs_as_an_unprivileged_user() -> None:
    steps = instructions()
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users, "no USER: the container would run as root"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0") and group not in ("root", "0")
    made = " ".join(rest for keyword, rest in steps if keyword == "RUN")
    uid = re.search(rf"useradd [^&]*--uid (\d+) [^&]*\b{user}\b", made)
    assert uid is not None and int(uid.group(1)) >= 1000, "the user is made with a fixed uid"
    # what it writes belongs to it: the config volume, the sockets, the fleet-key volume
    owned = re.search(rf"install -d -o {user} -g {user} -m 0700 ([^&]+)", made)
    assert owned is not None
    assert set(owned.group(1).split()) >= {"/etc/certagent", "/run/certagent", "/fleet"}
    # and USER comes after every RUN: nothing later runs as root
    last_run = max(i for i, (keyword, _) in enumerate(steps) if keyword == "RUN")
    assert [i for i, (keyword, _) in enumerate(steps) if keyword == "USER"][-1] > last_run


def test_the_healthcheck_asks_readyz() -> None:
    steps = instructions()
    (check,) = [rest for keyword, rest in steps if keyword == "HEALTHCHECK"]
    options, _, command = check.partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    argv = json.loads(command)  # exec form: no shell in between
    copied = {shlex.split(rest)[-1]: shlex.split(rest)[0] for kw, rest in steps if kw == "COPY"}
    script = ROOT / copied[argv[0]]
    assert script == ROOT / "docker" / "healthcheck.sh"
    assert script.stat().st_mode & 0o111, "the health check script must be executable"
    text = script.read_text()
    assert "/readyz" in text and "curl" not in text and "wget" not in text
    assert "certagent check" in text  # the API is off without a token


def test_compose_keeps_the_fleet_and_passes_the_token_as_a_secret() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert set(compose["services"]) == {"redis", "node1", "node2"}
    assert compose["secrets"] == {"api_token": {"file": "./demo-api-token"}}
    assert "fleet-key" in compose["volumes"]
    for name in ("node1", "node2"):
        node = compose["services"][name]
        assert node["secrets"] == ["api_token"]
        env = node["environment"]
        assert env["CERTAGENT_API_TOKEN_FILE"] == "/run/secrets/api_token"
        assert env["CERTAGENT_FLEET_KEY"].startswith("/fleet/")
        assert "fleet-key:/fleet" in node["volumes"]
        assert all(port.startswith("127.0.0.1:") for port in node["ports"])
        assert not any("TOKEN" in key and key.endswith("_TOKEN") for key in env)  # no token value
    # the token file stays out of git and out of the image's build context
    assert "/demo-api-token" in (ROOT / ".gitignore").read_text().splitlines()
    assert "demo-api-token" in (ROOT / ".dockerignore").read_text().splitlines()


def test_the_entrypoint_never_prints_a_token() -> None:
    text = (ROOT / "docker" / "entrypoint.sh").read_text()
    assert "shown once" not in text
    assert "--from-file" in text  # a token comes from a file, by its hash
    for line in text.splitlines():
        if re.search(r"\b(echo|say|printf)\b", line):
            assert "token add" not in line, line  # nothing `token add` prints reaches the log
