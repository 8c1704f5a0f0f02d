"""The container files, read as Docker and Compose would (no engine needed).

The entrypoint itself runs in tests/integration/test_docker_entrypoint.py; the images and
the compose demo are built and run in tests/docker/test_compose.py (with an engine).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


DOCKERFILES = (ROOT / "Dockerfile", ROOT / "docker" / "redis.Dockerfile",
               ROOT / "docker" / "pebble.Dockerfile")  # fmt: skip


def instructions(path: Path = ROOT / "Dockerfile") -> list[tuple[str, str]]:
    """A Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = path.read_text()
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
    assert set(compose["services"]) == {"redis", "pebble", "node1", "node2", "seed"}
    assert compose["secrets"] == {"api_token": {"file": "./demo-api-token"}}
    assert "fleet-key" in compose["volumes"]
    for name in ("node1", "node2"):
        node = compose["services"][name]
        assert node["secrets"] == ["api_token"]
        env = node["environment"]
        assert env["CERTAGENT_API_TOKEN_FILE"] == "/run/secrets/api_token"
        assert env["CERTAGENT_FLEET_KEY"].startswith("/fleet/")
        assert "fleet-key:/fleet" in node["volumes"]
        assert not any("TOKEN" in key and key.endswith("_TOKEN") for key in env)  # no token value
        # on demand from pebble, for the demo's suffix only
        assert env["CERTAGENT_ACME_DIRECTORY"].startswith("https://pebble:")
        assert env["CERTAGENT_ACME_ALLOW_SUFFIXES"] == "ondemand.demo.test"
    # the token file stays out of git and out of the image's build context
    assert "/demo-api-token" in (ROOT / ".gitignore").read_text().splitlines()


def test_compose_publishes_on_loopback_only_and_never_the_machine_s_ports() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    published = []
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
            # the host port: a CERTAGENT_DEMO_* variable (the compose test moves it), a default
            default = re.fullmatch(r"127\.0\.0\.1:\$\{CERTAGENT_DEMO_\w+:-(\d+)\}:\d+", port)
            assert default is not None, f"{name}: {port}"
            published.append(int(default.group(1)))
    assert sorted(published) == [8089, 8090, 8443, 8444]
    assert not {80, 443, 6379} & set(published)


def test_every_service_is_built_from_the_one_base_and_runs_read_only() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        assert "build" in service, f"{name} would be pulled from a registry"
        assert service["read_only"] is True, f"{name}: read-only root filesystem"
    for dockerfile in DOCKERFILES:
        bases = [rest.split()[0] for keyword, rest in instructions(dockerfile) if keyword == "FROM"]
        assert bases and set(bases) == {"debian:13-slim"}, (dockerfile.name, bases)
    for name in ("node1", "node2"):  # the unix sockets on a tmpfs the agent's user owns
        (tmpfs,) = compose["services"][name]["tmpfs"]
        where, _, options = tmpfs.partition(":")
        assert where == "/run/certagent"
        assert {"uid=10001", "gid=10001", "mode=0700"} <= set(options.split(","))


def test_the_node_image_installs_the_lock_and_keeps_no_build_tools() -> None:
    steps = instructions()
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in steps:
        if keyword == "FROM":
            stages.append([])
        stages[-1].append((keyword, rest))
    build, final = stages
    built = " ".join(rest for keyword, rest in build if keyword == "RUN")
    # the dependencies from the lock, hashes checked, wheels only; certagent built with the
    # lock's setuptools (requirements/build.txt), nothing unpinned fetched to build it
    assert "--require-hashes" in built and "-r /src/requirements/runtime.txt" in built
    assert "-r /src/requirements/build.txt" in built and "--no-build-isolation" in built
    assert built.count("--only-binary :all:") == 2
    # the final image: Debian's HAProxy and Python, the virtualenv, no pip or compiler
    installed = " ".join(rest for keyword, rest in final if keyword == "RUN")
    for tool in ("python3-pip", "python3-venv", "gcc", "build-essential", "python3-dev"):
        assert tool not in installed
    assert "haproxy" in installed
    copied = [rest for keyword, rest in final if keyword == "COPY"]
    assert [c for c in copied if c.startswith("--from=")] == [
        "--from=build /opt/certagent /opt/certagent",
        "--from=build /staging/opt/certagent /opt/certagent",
    ]
    assert not any(" /src" in c for c in copied)


def test_the_build_context_is_only_what_the_image_needs() -> None:
    lines = [
        line for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]  # fmt: skip
    assert lines[0] == "*"  # everything out, then what the Dockerfile copies back in
    allowed = {line[1:] for line in lines if line.startswith("!")}
    assert "demo-api-token" not in allowed and not any(a.startswith(".venv") for a in allowed)
    for keyword, rest in instructions():
        if keyword == "COPY" and not rest.startswith("--from="):
            for source in rest.split()[:-1]:
                assert any(source == a or source.startswith(a + "/") or a.startswith(source + "/")
                           for a in allowed), f"COPY {source} is not in the build context"


def test_the_entrypoint_never_prints_a_token() -> None:
    text = (ROOT / "docker" / "entrypoint.sh").read_text()
    assert "shown once" not in text
    assert "--from-file" in text  # a token comes from a file, by its hash
    for line in text.splitlines():
        if re.search(r"\b(echo|say|printf)\b", line):
            assert "token add" not in line, line  # nothing `token add` prints reaches the log
