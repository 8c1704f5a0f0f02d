"""``python -m bench.renewal [--smoke] [--only idle,throughput]``: run, print and write results.

Progress goes to stderr, the JSON result to stdout.  Results land in
``bench/results/<date>-renewal[-N].json`` and ``.md``; an existing file is never
overwritten.  Redis, pebble, HAProxy and the agent are started through
:mod:`certagent.testing` on free loopback ports and stopped by their PIDs.
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

from bench._runinfo import RESULTS, publish, run_meta, say
from bench.renewal.at_rest import idle_scenario
from bench.renewal.common import Env, Sizes
from bench.renewal.report import markdown
from bench.renewal.throughput import throughput_scenario
from certagent.testing import RedisFixture, RedisProcess, write_key_file
from certagent.testing.pebble import Pebble

SCENARIOS = ("idle", "throughput")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.renewal", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    p.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated, of: {', '.join(SCENARIOS)}"
    )
    p.add_argument("--scheduled", type=int, help="entries in the schedule at rest (idle)")
    p.add_argument("--due", type=int, help="certificates made due at once (throughput)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = p.parse_args(argv)
    unknown = set(args.only.split(",")) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    return args


class _Stop(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = Sizes.smoke() if args.smoke else Sizes()
    if args.scheduled is not None:
        sizes = Sizes(**{**sizes.__dict__, "scheduled": args.scheduled})
    if args.due is not None:
        sizes = Sizes(**{**sizes.__dict__, "due_at_once": args.due})
    only = [s for s in SCENARIOS if s in args.only.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-renewal-"))

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
    pebble = Pebble(work / "pebble")
    env: Env | None = None
    try:
        pebble.start()
        store = RedisFixture(redis.url, write_key_file(work / "data.key"))
        env = Env(work, redis, store, pebble, say)
        for name in only:
            say(f"bench.renewal: scenario {name} ...")
            t0 = time.perf_counter()
            if name == "idle":
                result[name] = idle_scenario(env, sizes)
            else:
                result[name] = throughput_scenario(env, sizes)
            result[name]["seconds"] = round(time.perf_counter() - t0, 1)
            redis.flushall()
    except (_Stop, KeyboardInterrupt) as exc:
        say(f"bench.renewal: stopped ({exc or 'Ctrl-C'})")
        return 130
    finally:
        if env is not None:
            env.close_all()
        pebble.stop()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    stem = dt.date.today().isoformat() + ("-renewal-smoke" if args.smoke else "-renewal")
    path = publish(result, args.out, stem, markdown(result), sort_keys=True)
    say(f"bench.renewal: wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
