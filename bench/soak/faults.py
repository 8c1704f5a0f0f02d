"""Faults on a schedule, one thread per kind, each recorded as a disruption window.

* agent SIGKILL (alternating nodes), restarted at once: the window lasts until the new
  agent answers, has adopted HAProxy's state and has its name filter
  (:meth:`Stack.wait_agent`);
* HAProxy reload (SIGUSR2 to the master, alternating nodes): until the new worker answers;
* CA outage: pebble stopped by PID for ``ca_down`` s, then started on its ports (a new
  root, which the clients trust from then on: its first leaves verify); until it answers;
* Redis primary failover (``--sentinel``): the primary SIGKILLed, until the sentinels
  have promoted the replica; the old primary is then started again, as a replica.

A fault that cannot be undone (an agent that does not start again) is an error: the run
ends early and the verdict fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from bench.soak.clients import Trust
from bench.soak.config import Faults, schedule
from bench.soak.disruptions import AGENT_DOWN, CA_DOWN, HAPROXY_RELOAD, REDIS_FAILOVER, Disruptions
from bench.soak.fleet import AGENT_START_TIMEOUT, Fleet
from certagent.testing import StackError, wait_for

#: offsets (s) so that faults of different kinds rarely land on the same second
OFFSETS = {"kill": 0.0, "ca": 20.0, "reload": 40.0, "failover": 60.0}


class FaultRunner:
    def __init__(
        self,
        fleet: Fleet,
        faults: Faults,
        duration: float,
        disruptions: Disruptions,
        trust: Trust,
        say: Callable[[str], None],
    ) -> None:
        self.fleet, self.faults, self.duration = fleet, faults, duration
        self.disruptions, self.trust, self.say = disruptions, trust, say
        self.errors: list[str] = []
        self.done: dict[str, int] = {"kill": 0, "ca": 0, "reload": 0, "failover": 0}
        self._stop = threading.Event()
        self._t0 = 0.0
        plans: list[tuple[str, float, Callable[[int], None]]] = [
            ("kill", faults.kill_every, self._kill),
            ("ca", faults.ca_every, self._ca_outage),
            ("reload", faults.reload_every, self._reload),
        ]
        if fleet.sentinels is not None:
            plans.append(("failover", faults.failover_every, self._failover))
        self._threads = [
            threading.Thread(
                target=self._run, args=(kind, every, action), name=f"soak-{kind}", daemon=True
            )
            for kind, every, action in plans
            if every > 0
        ]

    def planned(self) -> dict[str, list[float]]:
        """Seconds into the run at which each kind of fault is planned."""
        every = {
            "kill": self.faults.kill_every,
            "ca": self.faults.ca_every,
            "reload": self.faults.reload_every,
            "failover": self.faults.failover_every if self.fleet.sentinels is not None else 0.0,
        }
        return {k: schedule(v, self.duration, OFFSETS[k]) for k, v in every.items()}

    def start(self, t0: float) -> FaultRunner:
        self._t0 = t0
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 90.0) -> list[str]:
        """Stop the threads (a fault under way is undone first); names those still running."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        return [t.name for t in self._threads if t.is_alive()]

    def _run(self, kind: str, every: float, action: Callable[[int], None]) -> None:
        for n, at in enumerate(schedule(every, self.duration, OFFSETS[kind])):
            if self._stop.wait(max(0.0, self._t0 + at - time.time())):
                return
            try:
                action(n)
            except (OSError, StackError, subprocess.SubprocessError, redis.RedisError) as exc:
                self.errors.append(f"{kind} #{n + 1}: {type(exc).__name__}: {exc}")
                self.say(f"bench.soak: fault {kind} #{n + 1} failed: {exc}")
                return
            self.done[kind] += 1

    # --- the faults --------------------------------------------------------------------

    def _kill(self, n: int) -> None:
        index = n % len(self.fleet.stacks)
        stack = self.fleet.stacks[index]
        proc = stack.agent
        if proc is None or proc.poll() is not None:
            raise StackError(f"node{index}'s agent is not running")
        window = self.disruptions.open(AGENT_DOWN, index, f"SIGKILL pid {proc.pid}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        try:
            stack.start_agent(timeout=AGENT_START_TIMEOUT)
        finally:
            new = stack.agent.pid if stack.agent is not None else None
            self.disruptions.close(window, f"restarted as pid {new}")
        self.say(f"bench.soak: node{index}'s agent killed and back ({_took(window)})")

    def _reload(self, n: int) -> None:
        index = n % len(self.fleet.stacks)
        stack = self.fleet.stacks[index]
        window = self.disruptions.open(HAPROXY_RELOAD, index, "SIGUSR2 to the master")
        try:
            pid = stack.reload_haproxy()
        finally:
            self.disruptions.close(window)
        window.note += f"; new worker pid {pid}"
        self.say(f"bench.soak: node{index}'s HAProxy reloaded ({_took(window)})")

    def _ca_outage(self, n: int) -> None:
        pebble = self.fleet.pebble
        assert pebble is not None
        window = self.disruptions.open(
            CA_DOWN, None, f"pebble pid {pebble.proc and pebble.proc.pid}"
        )
        pebble.stop_ca()
        self.say(f"bench.soak: CA stopped for {self.faults.ca_down:.0f} s")
        self._stop.wait(self.faults.ca_down)  # cut short at the end of the run
        try:
            pebble.start_ca(timeout=AGENT_START_TIMEOUT)
            self.trust.add_pebble_root(pebble.roots_pem())
        finally:
            self.disruptions.close(window, "pebble started again (a new root)")
        self.say(f"bench.soak: CA back ({_took(window)})")

    def _failover(self, n: int) -> None:
        sentinels = self.fleet.sentinels
        assert sentinels is not None
        old = sentinels.current_master()
        window = self.disruptions.open(REDIS_FAILOVER, None, f"SIGKILL {old.name} pid {old.pid}")
        try:
            sentinels.kill_master()
            new = sentinels.wait_promoted(old, timeout=60.0)
        finally:
            self.disruptions.close(window)
        window.note += f"; {new.name} promoted"
        self.say(f"bench.soak: Redis primary failed over to {new.name} ({_took(window)})")
        old.start()  # back as a replica: the sentinels reconfigure it
        old.wait_ping(timeout=AGENT_START_TIMEOUT)

        def replica_in_sync() -> bool:
            with old.client() as client:
                info: dict[str, Any] = client.info("replication")
            return info.get("role") == "slave" and info.get("master_link_status") == "up"

        wait_for(replica_in_sync, 60.0, f"{old.name} back as a replica", interval=0.2)


def _took(window: Any) -> str:
    return f"{(window.end or time.time()) - window.start:.1f} s"
