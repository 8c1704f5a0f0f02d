"""``python -m bench.scale [--smoke] [--only S,...]``: run, print JSON, write JSON + Markdown.

Progress goes to stderr, the JSON result to stdout.  Results land in
``bench/results/<date>-scale[-N].json`` and ``.md``; an existing file is never
overwritten.  Every process is started through :mod:`certagent.testing` and
stopped by its PID, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from bench import _native
from bench._certs import Leaves
from bench._runinfo import RESULTS, publish, run_meta, say
from bench.scale import at_rest, hit_ratio, new_host, recycles, reload, storm
from bench.scale.common import Env, Sizes
from bench.scale.report import markdown, targets
from certagent.testing import PKI, RedisFixture, RedisProcess, write_key_file

SCENARIOS = (
    "hit_ratio",
    "idle",
    "idle_ha",
    "store_kinds",
    "new_host",
    "storm",
    "reload",
    "capacity",
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--smoke", action="store_true", help="every scenario at tiny sizes (~1 min)")
    p.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated, of: {', '.join(SCENARIOS)}"
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    p.add_argument("--keep-work", action="store_true", help="keep the scratch directory")
    args = p.parse_args(argv)
    unknown = set(args.only.split(",")) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    return args


def latest_profiles(out: Path) -> list[str]:
    """The newest agent and HAProxy profile reports in ``out`` (bench.profile_agent/_load)."""
    found = []
    for pattern in ("*-agent-profile*.md", "*-load-profile*.md"):
        files = sorted(out.glob(pattern))
        if files:
            found.append(files[-1].name)
    return found


class _Stop(Exception):
    pass


def run_scenario(
    name: str, env: Env, sizes: Sizes, leaves: Leaves, native: Path | None
) -> dict[str, Any]:
    """One scenario's JSON-ready result; ``native``: the storm's C client, if built."""
    if name == "capacity":
        return recycles.capacity(env, sizes, leaves)
    if name == "store_kinds":
        return recycles.store_kinds(env, sizes, leaves)
    if name == "new_host":
        return new_host.new_host(env, sizes, _both_key_types(env))
    if name == "storm":
        return storm.storm_scenario(env, sizes, leaves, native)
    if name == "reload":
        return reload.reload_scenario(env, sizes, leaves)
    if name == "idle":
        return at_rest.idle_scenario(env, sizes, leaves)
    if name == "idle_ha":
        return at_rest.idle_ha_scenario(env, sizes, leaves)
    if name == "hit_ratio":
        return hit_ratio.hit_ratio(sizes)
    raise ValueError(f"unknown scenario {name!r}")


def _both_key_types(env: Env) -> dict[str, PKI]:
    """The ECDSA CA, and an RSA one; one client trusts both roots."""
    rsa = PKI.create(env.work / "rsa-ca.pem", name="certagent bench RSA CA", key_type="rsa")
    both = env.work / "roots.pem"
    both.write_bytes(env.pki.cafile.read_bytes() + rsa.cafile.read_bytes())
    return {"ecdsa": env.pki, "rsa2048": PKI(rsa.ca, both, "rsa")}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = Sizes.smoke() if args.smoke else Sizes()
    only = [s for s in SCENARIOS if s in args.only.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "meta": {
            **run_meta(),
            "smoke": args.smoke,
            "sizes": sizes.__dict__,
        }
    }
    redis = RedisProcess(work / "redis").start()
    env: Env | None = None
    try:
        store = RedisFixture(redis.url, write_key_file(work / "data.key"))
        pki = PKI.create(work / "ca.pem")
        env = Env(work, redis, store, pki, say)
        leaves = Leaves(pki)
        built = _native.try_build(work / "native")
        if built.binary is None:
            say(f"bench.scale: the storm uses the Python client: {built.reason}")
        for name in only:
            say(f"bench.scale: scenario {name} ...")
            t0 = time.perf_counter()
            result[name] = run_scenario(name, env, sizes, leaves, built.binary)
            result[name]["seconds"] = round(time.perf_counter() - t0, 1)
            redis.flushall()
    except (_Stop, KeyboardInterrupt) as exc:
        say(f"bench.scale: stopped ({exc or 'Ctrl-C'})")
        return 130
    finally:
        if env is not None:
            env.close_all()
        redis.stop()
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    result["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    result["targets"] = targets(result)
    result["profiles"] = latest_profiles(args.out)
    stem = dt.date.today().isoformat() + ("-scale-smoke" if args.smoke else "-scale")
    path = publish(result, args.out, stem, markdown(result), sort_keys=True)
    say(f"bench.scale: wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
