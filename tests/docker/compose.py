"""docker-compose.yml run as a project of its own, for the compose test.

:class:`ComposeProject` drives one Compose client (v1's ``docker-compose`` 1.29, or v2,
the ``docker compose`` plugin or its binary run on its own) against the repository's
compose file, with three differences from the README's ``docker-compose up``, none
inside the images:

* its own project name (``certagent-test-<random>``), so its containers, network and
  volumes never meet a demo of the user's, and ``down -v`` can be checked to leave
  none of them behind (found by Compose's labels, which both clients set);
* host ports chosen free (``CERTAGENT_DEMO_*``, which the compose file reads), still
  on 127.0.0.1 only, and images tagged for the client (``test-v1``, ``test-v2``) instead of
  the demo's ``local``;
* the API token's secret from a file of the test (an override file names it).

Every wait is bounded; a failed wait says what it waited for, with the services' log tails.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from certagent.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
LABEL = "com.docker.compose.project"


class ComposeError(AssertionError):
    """A compose or docker command failed, or a wait ran out; the message says which."""


def docker(*args: str, timeout: float = 60, check: bool = True) -> str:
    """``docker ARGS`` (the engine's CLI); its stdout."""
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise ComposeError(
            f"docker {' '.join(args)}: exit {done.returncode}: {done.stderr[-2000:]}"
        )
    return done.stdout


def engine_answers() -> str | None:
    """None if a Docker engine answers, else why not."""
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info: {exc}"
    if done.returncode != 0:
        return f"docker info: {done.stderr.strip()[-300:]}"
    return None


def client_version(command: Sequence[str]) -> str | None:
    """The client's version line (``docker-compose version 1.29.2 ...``), or None if absent."""
    try:
        done = subprocess.run(
            [*command, "version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    if done.returncode != 0:
        return None
    return done.stdout.splitlines()[0].strip() if done.stdout else None


@dataclass
class ComposeProject:
    command: tuple[str, ...]  # ("docker-compose",) or ("docker", "compose") or a v2 binary
    workdir: Path
    tag: str  # the images' tag (CERTAGENT_DEMO_TAG), one per client
    name: str = field(default_factory=lambda: f"certagent-test-{secrets.token_hex(4)}")
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    ports: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        secret = self.workdir / "api_token"
        secret.write_text(self.token + "\n")
        secret.chmod(0o644)  # Compose mounts it with this mode; uid 10001 reads it
        self.override = self.workdir / "override.yml"
        # a (non-empty) "services" makes v1 read it as the Compose Specification, as the
        # main file; it repeats what the main file says
        self.override.write_text(
            "services:\n  seed:\n    secrets: [api_token]\n"
            "secrets:\n  api_token:\n    file: " + json.dumps(str(secret)) + "\n"
        )
        for key in ("NODE1_TLS", "NODE1_API", "NODE2_TLS", "NODE2_API"):
            self.ports[key] = free_port()

    # --- commands -------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CERTAGENT_DEMO_")}
        env.update({f"CERTAGENT_DEMO_{key}": str(port) for key, port in self.ports.items()})
        # images of its own per client: v1 (the classic builder) and v2 (BuildKit) keep
        # separate caches, and a tag one moved would leave the other's cache to be pruned
        env["CERTAGENT_DEMO_TAG"] = self.tag
        return env

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        argv = [
            *self.command,
            "--project-name", self.name,
            "--file", str(ROOT / "docker-compose.yml"),
            "--file", str(self.override),
            *args,
        ]  # fmt: skip
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv, cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise ComposeError(f"{shlex.join(argv)}: no end within {timeout:.0f} s") from exc
        self.timings[args[0]] = self.timings.get(args[0], 0.0) + time.monotonic() - started
        if check and done.returncode != 0:
            raise ComposeError(
                f"{shlex.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}\n"
                f"{self.log_tails()}"
            )
        return done.stdout

    def log_tails(self, lines: int = 30) -> str:
        try:
            done = subprocess.run(
                [*self.command, "--project-name", self.name,
                 "--file", str(ROOT / "docker-compose.yml"), "--file", str(self.override),
                 "logs", "--no-color", "--tail", str(lines)],
                cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"(no logs: {exc})"
        return done.stdout[-8000:]

    # --- what the project made ------------------------------------------------------------

    def container(self, service: str) -> str:
        """The ID of ``service``'s container (the one ``up`` made, running or exited)."""
        ids = docker(
            "ps", "-aq", "--filter", f"label={LABEL}={self.name}",
            "--filter", f"label=com.docker.compose.service={service}",
            "--filter", "label=com.docker.compose.oneoff=False",
        ).split()  # fmt: skip
        if len(ids) != 1:
            raise ComposeError(f"{service}: {len(ids)} containers, not one")
        return ids[0]

    def inspect(self, service: str) -> dict[str, object]:
        found: list[dict[str, object]] = json.loads(docker("inspect", self.container(service)))
        return found[0]

    def state(self, service: str) -> dict[str, object]:
        state = self.inspect(service)["State"]
        assert isinstance(state, dict)
        return state

    def health(self, service: str) -> str:
        health = self.state(service).get("Health")
        return str(health.get("Status")) if isinstance(health, dict) else "none"

    def wait(self, what: str, probe: object, timeout: float) -> None:
        """Poll ``probe()`` (a callable returning bool) every second until true, bounded."""
        assert callable(probe)
        deadline = time.monotonic() + timeout
        while not probe():
            if time.monotonic() > deadline:
                raise ComposeError(f"no {what} within {timeout:.0f} s\n{self.log_tails()}")
            time.sleep(1)

    def leftovers(self) -> dict[str, list[str]]:
        """The project's containers, networks and volumes that exist now (by label)."""
        label = f"label={LABEL}={self.name}"
        return {
            "containers": docker("ps", "-aq", "--filter", label).split(),
            "networks": docker("network", "ls", "-q", "--filter", label).split(),
            "volumes": docker("volume", "ls", "-q", "--filter", label).split(),
        }
