"""Where an import worker's CPU goes per file: before (a PreparedRecord) and now (packed bytes).

    .venv/bin/python -m bench.import_stages [--count N] [--passes P] [--out DIR]

One process does, per combined PEM file (ECDSA P-256, a key of its own, one
shared intermediate: the files of ``bench.import_rate --keys distinct``), what
an import worker does, timed stage by stage with ``time.process_time``: read
the file, validate it (an ``UploadChecker``), encode the record (key
encrypted), pickle it and unpickle it (the trip to the importing process).
``before``: the record as a ``PreparedRecord`` decoded from the bundle's PEM
(what the workers sent at 9b80551); ``after``: the record's whole ``EVALSHA``
packed by hiredis (``RecordEncoder.encode`` with the writer's ``AddCall``),
sent as a small ``WireRecord``, the certificates' DER taken from the check.
The two take turns, ``--passes`` times over the same ``--count`` files, with
the costs no import can skip measured alone in between: the leaf's ECDSA
signature verification and the private key's load.  Medians of the passes, in
µs per file.  ``--profile``: then ``prepare_batch`` itself, as a worker runs
it (batches of 200, ``BatchJob`` and all), under cProfile: the functions with
the most time of their own, in µs per file (the profiler's overhead
included: read the shares).  The importing process (sending to Redis) and
redis-server are not here: see ``bench.import_rate``; the floor of the whole
import: ``bench.import_floor``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import pickle
import pstats
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench._runinfo import RESULTS, run_meta, say, write_results
from bench.import_rate import DEFAULT_CACHE, certificates
from certagent.certs.bulkcheck import UploadChecker
from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.certs.validate import UploadPolicy
from certagent.cli._import_work import BatchJob, prepare_batch, read_file
from certagent.store.redis import AddCall, Keys, RecordEncoder

STAGES = ("read", "validate", "encode", "pickle")
TOP = 20


def one_pass(paths: list[Path], after: bool, encoder: RecordEncoder) -> dict[str, float]:
    policy, now = UploadPolicy(), datetime.now(UTC)
    checker = UploadChecker(policy, rsa_key_check="sign")
    spent = dict.fromkeys(STAGES, 0.0)
    clock = time.process_time
    for path in paths:
        t0 = clock()
        data = read_file(path)
        t1 = clock()
        bundle = checker.validate(data, None, now=now)
        t2 = clock()
        if after:
            record: object = encoder.encode(bundle, now)
        else:
            bundle = dataclasses.replace(bundle, ders=None)  # as the checker gave it before
            t2 = clock()
            record = encoder.prepare(bundle, now)
        t3 = clock()
        pickle.loads(pickle.dumps(record))
        t4 = clock()
        for stage, seconds in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            spent[stage] += seconds
    return {stage: seconds / len(paths) * 1e6 for stage, seconds in spent.items()}


def worker_profile(paths: list[Path], encoder: RecordEncoder) -> list[dict[str, Any]]:
    """``prepare_batch`` over ``paths`` in batches of 200 under cProfile: the top own times."""
    now = datetime.now(UTC)
    jobs = [
        BatchJob(
            tuple((str(p), None) for p in paths[i : i + 200]),
            UploadPolicy(), encoder, now, now.replace(microsecond=0),
        )
        for i in range(0, len(paths), 200)
    ]  # fmt: skip
    prepare_batch(jobs[0])  # the worker's checker and packer made, as after its first batch
    profiler = cProfile.Profile()
    profiler.enable()
    for job in jobs:
        prepare_batch(job)
    profiler.disable()
    table: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda kv: kv[1][2], reverse=True)[:TOP]
    return [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "calls": calls,
            "own_us_per_file": round(own_s / len(paths) * 1e6, 1),
            "cumulative_us_per_file": round(cum_s / len(paths) * 1e6, 1),
        }
        for (file, line, name), (_, calls, own_s, cum_s, _) in rows
    ]


def primitives(path: Path, rounds: int = 2000) -> dict[str, float]:
    """The leaf's ECDSA verification and the key's load, alone in a loop, µs each."""
    data = path.read_bytes()
    chain, _, key_tail = data.partition(b"-----BEGIN PRIVATE KEY-----")
    leaf, issuer = x509.load_pem_x509_certificates(chain)[:2]
    key_text = b"-----BEGIN PRIVATE KEY-----" + key_tail
    issuer_key = issuer.public_key()
    assert isinstance(issuer_key, ec.EllipticCurvePublicKey)
    clock = time.process_time
    t0 = clock()
    for _ in range(rounds):
        issuer_key.verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    t1 = clock()
    for _ in range(rounds):
        serialization.load_pem_private_key(key_text, None)
    t2 = clock()
    return {"ecdsa_verify": (t1 - t0) / rounds * 1e6, "key_load": (t2 - t1) / rounds * 1e6}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.import_stages", description=__doc__)
    p.add_argument("--count", type=int, default=2000, help="files per pass (2,000)")
    p.add_argument("--passes", type=int, default=3, help="passes of each (3)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--profile", action="store_true", help="then prepare_batch under cProfile")
    p.add_argument("--out", type=Path, default=None, help=f"write results there ({RESULTS})")
    args = p.parse_args(argv)
    source = certificates(args.cache, args.count, "ec", True)
    paths = sorted(source.glob("*.pem"))[: args.count]
    encoder = RecordEncoder(KeyRing.from_text(generate_key_line()), AddCall(Keys(), 10_000))
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": [], "alone": []}
    for n in range(args.passes):
        say(f"import_stages: pass {n + 1}/{args.passes}")
        runs["before"].append(one_pass(paths, False, encoder))
        runs["after"].append(one_pass(paths, True, encoder))
        runs["alone"].append(primitives(paths[0]))
    medians: dict[str, Any] = {
        which: {k: round(statistics.median(r[k] for r in found), 1) for k in found[0]}
        for which, found in runs.items()
    }
    for which in ("before", "after"):
        medians[which]["total"] = round(sum(medians[which].values()), 1)
    result = {
        "benchmark": "cert import: a worker's CPU per file, by stage (µs)",
        "meta": run_meta(),
        "argv": sys.argv[1:] if argv is None else argv,
        "files": len(paths),
        "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "medians_us": medians,
        "passes": runs,
    }
    if args.profile:
        say("import_stages: prepare_batch under cProfile")
        result["profile"] = worker_profile(paths, encoder)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        written = write_results(args.out, _stem(result), text, markdown(result))
        say(f"import_stages: wrote {written}")
    return 0


def _stem(result: dict[str, Any]) -> str:
    return f"{result['meta']['date'][:10]}-import-stages"


def markdown(result: dict[str, Any]) -> str:
    m, before, after = result["medians_us"], "before", "after"
    lines = [
        f"# cert import: a worker's CPU per file, by stage, {result['meta']['date'][:10]}",
        "",
        f"`python -m bench.import_stages {' '.join(result['argv'])}` at"
        f" {result['meta']['revision']}; {result['files']:,} files (ECDSA P-256, own key, one"
        f" shared intermediate) per pass, before and after by turns; load average"
        f" {result['loadavg_1min'][0]}-{result['loadavg_1min'][1]} on"
        f" {result['meta']['machine']['nproc']} CPUs. µs of CPU per file, median of the passes.",
        "",
        "| stage | before | after |",
        "|---|---:|---:|",
        *(f"| {stage} | {m[before][stage]} | {m[after][stage]} |" for stage in (*STAGES, "total")),
        "",
        f"Alone in a loop: the leaf's ECDSA P-256 verification {m['alone']['ecdsa_verify']} µs,"
        f" the private key's load {m['alone']['key_load']} µs.",
    ]
    if "profile" in result:
        lines += [
            "",
            "`prepare_batch` as a worker runs it, under cProfile (the profiler's overhead"
            " included: read the shares), µs per file:",
            "",
            "| function | calls | own | cumulative |",
            "|---|---:|---:|---:|",
            *(
                f"| `{r['function']}` | {r['calls']:,} | {r['own_us_per_file']}"
                f" | {r['cumulative_us_per_file']} |"
                for r in result["profile"]
            ),
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
