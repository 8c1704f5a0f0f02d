"""``python -m bench.soak --minutes M``: a fleet on pebble and Redis, verified for M minutes.

Two or more nodes (HAProxy + agent, the agent's defaults except the CA) on one Redis
(``--sentinel``: a Sentinel set), pebble issuing ``--lifetime`` s certificates to
``--names`` on-demand names, ``--imported`` certificates of a test CA, ``--capacity``
slots per node (below the names in use, so slots recycle), ``--clients`` threads doing
verified handshakes round-robin over every name on every node, and with ``--faults`` an
agent SIGKILLed, HAProxy reloaded, the CA stopped and (``--sentinel``) the Redis primary
failed over on a schedule.  Prints one JSON document: handshakes by outcome and
disruption, the disruption windows, orders against renewals due, overdue renewals at
the end, RSS / descriptors / CPU of every process over time, and a verdict on issue 29's
"Must show".  ``--out PREFIX`` also writes PREFIX.json and PREFIX.md (never over an
existing file).  Progress goes to stderr.  Everything listens on loopback, is stopped by
its PID, and the scratch folder is removed (``--keep`` keeps it).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from bench._runinfo import run_meta, say
from bench.soak.clients import Clients, Tally, Trust
from bench.soak.config import Faults, SoakConfig, imported_host, ondemand_host
from bench.soak.disruptions import Disruptions
from bench.soak.faults import FaultRunner
from bench.soak.fleet import Fleet
from bench.soak.renewals import account
from bench.soak.report import markdown, verdict
from bench.soak.sampler import Sampler
from bench.soak.warmup import issue_all
from certagent.testing import StackError

PROGRESS_EVERY = 60.0
WARMUP_PER_NAME = 1.0  # s of warm-up allowed per on-demand name, on top of a minute


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = Faults()
    p = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--minutes", type=float, required=True, help="measured run, after warm-up")
    p.add_argument("--nodes", type=int, default=2, help="nodes on the store (default 2)")
    p.add_argument("--names", type=int, default=200, help="on-demand names (default 200)")
    p.add_argument("--imported", type=int, default=200, help="imported certificates (200)")
    p.add_argument("--capacity", type=int, default=150, help="slots per node (default 150)")
    p.add_argument("--lifetime", type=int, default=300, help="pebble's certificates, s (300)")
    p.add_argument("--clients", type=int, default=3, help="verifying client threads (3)")
    p.add_argument("--pause", type=float, default=0.0, help="s between a client's handshakes")
    p.add_argument("--sample-every", type=float, default=10.0, help="process samples, s (10)")
    p.add_argument("--sentinel", action="store_true", help="a Sentinel set instead of one Redis")
    p.add_argument("--faults", action="store_true", help="faults on the schedule below")
    p.add_argument("--kill-every", type=float, default=d.kill_every, help="agent SIGKILL, s")
    p.add_argument("--ca-every", type=float, default=d.ca_every, help="CA outage every, s")
    p.add_argument("--ca-down", type=float, default=d.ca_down, help="CA outage length, s")
    p.add_argument("--reload-every", type=float, default=d.reload_every, help="HAProxy reload, s")
    p.add_argument(
        "--failover-every", type=float, default=d.failover_every, help="primary failover, s"
    )
    p.add_argument("--out", type=Path, help="write PREFIX.json and PREFIX.md (never over files)")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (logs)")
    args = p.parse_args(argv)
    if args.nodes < 2:
        p.error("--nodes must be at least 2 (a fleet)")
    if args.names < 1 or args.clients < 1 or args.minutes <= 0:
        p.error("--names, --clients and --minutes must be positive")
    if args.out is not None:
        taken = [str(f) for f in _outputs(args.out) if f.exists()]
        if taken:
            p.error(f"refusing to overwrite existing result files: {', '.join(taken)}")
    return args


def _outputs(prefix: Path) -> tuple[Path, Path]:
    return prefix.with_name(prefix.name + ".json"), prefix.with_name(prefix.name + ".md")


def config_from(args: argparse.Namespace) -> SoakConfig:
    faults = None
    if args.faults:
        faults = Faults(
            args.kill_every, args.ca_every, args.ca_down, args.reload_every, args.failover_every
        )
    return SoakConfig(
        minutes=args.minutes,
        nodes=args.nodes,
        names=args.names,
        imported=args.imported,
        capacity=args.capacity,
        lifetime=args.lifetime,
        clients=args.clients,
        pause=args.pause,
        sample_every=args.sample_every,
        sentinel=args.sentinel,
        faults=faults,
    )


class _Stop(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = config_from(args)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    fleet = Fleet(cfg, say)
    try:
        result = soak(fleet, cfg)
    except (_Stop, KeyboardInterrupt) as exc:
        say(f"bench.soak: stopped ({exc or 'Ctrl-C'})")
        return 130
    except StackError as exc:
        say(f"bench.soak: the fleet did not start: {exc}")
        return 1
    finally:
        for line in fleet.close(keep=args.keep):
            say(f"bench.soak: stopped {line}")
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        json_path, md_path = _outputs(args.out)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        with json_path.open("x") as fh:  # "x": never over a file that appeared meanwhile
            fh.write(text + "\n")
        with md_path.open("x") as fh:
            fh.write(markdown(result))
        say(f"bench.soak: wrote {json_path} and {md_path}")
    say(f"bench.soak: verdict {'PASS' if result['verdict']['pass'] else 'FAIL'}")
    return 0


def soak(fleet: Fleet, cfg: SoakConfig) -> dict[str, Any]:
    started = time.time()
    meta = run_meta()
    fleet.start()
    assert fleet.pebble is not None and fleet.pki is not None and fleet.store is not None
    trust = Trust(fleet.pki.ca.root_pem, fleet.pebble.roots_pem())
    errors: list[str] = []

    say(f"bench.soak: warm-up: issuing {cfg.names} on-demand names ...")
    ondemand = [ondemand_host(i) for i in range(cfg.names)]
    warm_t0 = time.monotonic()
    first, missing = issue_all(
        fleet.stacks, ondemand, trust, warm_t0 + 60.0 + WARMUP_PER_NAME * cfg.names
    )
    warmup_s = round(time.monotonic() - warm_t0, 1)
    if missing:
        errors.append(f"{len(missing)} names never served in the warm-up, e.g. {missing[:3]}")
    say(f"bench.soak: warm-up done in {warmup_s} s; running {cfg.minutes} min ...")

    names = [(h, False) for h in ondemand] + [(imported_host(i), True) for i in range(cfg.imported)]
    disruptions = Disruptions()
    t0 = time.time()
    tally = Tally(t0)
    sampler = Sampler(fleet.pids, cfg.sample_every, t0).start()
    clients = Clients(
        fleet.stacks, names, trust, disruptions, tally, cfg.clients, cfg.pause
    ).start()
    faults = FaultRunner(fleet, cfg.faults or Faults.off(), cfg.seconds, disruptions, trust, say)
    faults.start(t0)
    next_progress = t0 + PROGRESS_EVERY
    while time.time() < t0 + cfg.seconds:
        time.sleep(1.0)
        problems = faults.errors + fleet.check_alive()
        if problems:
            errors += problems
            say(f"bench.soak: ending early: {problems}")
            break
        if time.time() >= next_progress:
            next_progress += PROGRESS_EVERY
            by = tally.as_dict(cfg.nodes)["by_outcome"]
            say(f"bench.soak: {(time.time() - t0) / 60:.0f} min: {by}")
    end = time.time()
    stuck = faults.stop() + clients.stop()
    if stuck:
        errors.append(f"threads that did not stop: {stuck}")
    sampler.stop()
    duration = end - t0
    say("bench.soak: reading the renewal state ...")
    renewal = account(fleet.stacks, fleet.pebble, fleet.store, first, cfg.lifetime, end)
    handshakes = tally.as_dict(cfg.nodes)
    result: dict[str, Any] = {
        "meta": {**meta, "seconds": round(time.time() - started, 1), "warmup_s": warmup_s},
        "config": cfg.as_dict(),
        "duration_s": round(duration, 1),
        "handshakes": handshakes,
        "handshakes_per_s": round(handshakes["total"] / duration, 1) if duration else None,
        "disruptions": [w.as_dict(t0) for w in disruptions.windows()],
        "faults_planned": faults.planned() if cfg.faults else {},
        "faults_done": faults.done,
        "warmup": {
            "names": len(first),
            "missing": len(missing),
            "attempts_max": max((f.attempts for f in first), default=0),
        },
        "renewal": renewal,
        "processes": sampler.summaries(duration),
        "errors": errors,
    }
    result["verdict"] = verdict(result)
    return result


if __name__ == "__main__":
    sys.exit(main())
