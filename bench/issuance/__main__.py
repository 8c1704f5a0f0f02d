"""``python -m bench.issuance [--smoke]``: run, print JSON, write JSON + Markdown.

Progress goes to stderr, the JSON result to stdout.  Results land in
``bench/results/<date>-issuance[-N].json`` and ``.md``; an existing file is never
overwritten.  Every process is started through :mod:`certagent.testing` and
stopped by its PID, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
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
from bench.issuance.report import markdown
from bench.issuance.rig import SUFFIX, Rig
from bench.issuance.run import Sizes, pebble_version, run
from certagent.testing import StackError
from certagent.testing.pebble import installed


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.issuance",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    p.add_argument("--names", type=int, help=f"new names per repeat and variant ({Sizes.names})")
    p.add_argument("--repeats", type=int, help=f"repeats ({Sizes.repeats})")
    p.add_argument(
        "--workers", type=int, help=f"clients at once, concurrent variant ({Sizes.workers})"
    )
    p.add_argument(
        "--concurrency", type=int, help="the agent's acme_concurrency (default: --workers)"
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    p.add_argument("--keep-work", action="store_true", help="keep the scratch directory")
    p.add_argument(
        "--log-level",
        default="debug",
        help="the agent's log level (debug, the default: the breakdown needs its ACME lines)",
    )
    return p.parse_args(argv)


def sizes_of(args: argparse.Namespace) -> Sizes:
    base = Sizes.smoke() if args.smoke else Sizes()
    return Sizes(
        names=args.names or base.names,
        repeats=args.repeats or base.repeats,
        workers=args.workers or base.workers,
    )


class _Stop(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = sizes_of(args)
    if not installed():
        say("bench.issuance: pebble is not installed; run scripts/install.sh")
        return 2

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "meta": {
            **run_meta(),
            "pebble": pebble_version(),
            "smoke": args.smoke,
            "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
            "sizes": sizes.__dict__,
            "setup": {
                "challenge": "http-01 (answered by HAProxy's fe_http map)",
                "key_type": "ecdsa",
                "allowed_by": f"acme_allow_suffixes = {SUFFIX!r}",
                "acme_concurrency": args.concurrency or sizes.workers,
                "pebble": "PEBBLE_VA_NOSLEEP=1, PEBBLE_WFE_NONCEREJECT=0, PEBBLE_AUTHZREUSE=0",
                "client": "Python ssl, pebble's root only, check_hostname; timed from connect()",
                "agent_log_level": args.log_level,
            },
        }
    }
    work = Path(tempfile.mkdtemp(prefix="bench-issuance-"))
    rig = Rig(
        work,
        capacity=2 * sizes.names * sizes.repeats + 50,
        concurrency=args.concurrency or sizes.workers,
        log_level=args.log_level,
    )
    try:
        say("bench.issuance: starting Redis, pebble, HAProxy and the agent ...")
        rig.start()
        result.update(run(rig, sizes, say))
    except (_Stop, KeyboardInterrupt) as exc:
        say(f"bench.issuance: stopped ({exc or 'Ctrl-C'})")
        return 130
    except (StackError, RuntimeError) as exc:
        say(f"bench.issuance: failed: {exc}")
        if rig.stack is not None:
            say(rig.stack.log_tails())
        return 1
    finally:
        stopped = rig.close()
        say("bench.issuance: stopped " + ", ".join(stopped))
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    result["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    result["meta"]["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    stem = dt.date.today().isoformat() + ("-issuance-smoke" if args.smoke else "-issuance")
    path = publish(result, args.out, stem, markdown(result))
    say(f"bench.issuance: wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
