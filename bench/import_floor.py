"""The floor of ``cert import`` on this machine: CPU per certificate no import can skip.

    .venv/bin/python -m bench.import_floor [--count N] [--passes P] [--cache DIR] [--out DIR]

Prints one JSON document on stdout (progress on stderr).  Over ``--count``
combined PEM files of ``bench.import_rate --keys distinct`` (ECDSA P-256, a key
of their own, one shared intermediate), each operation an import must do per
certificate is timed alone in a loop (``time.process_time``), ``--passes``
times, and the median taken:

* ``leaf_parse``: the leaf's PEM to a certificate object;
* ``leaf_verify``: the leaf's ECDSA signature checked against the intermediate
  (parsed once, as the import does);
* ``key_load``: the private key's PEM to a key object;
* ``key_match``: the key's public half compared with the leaf's;
* ``key_encrypt``: AES-256-GCM of the key's DER, bound to the record;
* ``redis_write``: redis-server's CPU per record for the add script
  (``ADD_SCRIPT``: the record, its indexes and its event), the calls packed
  ahead and sent 200 per write on one connection, from ``/proc/<pid>/stat``,
  into a fresh private ``redis-server`` each pass;
* ``file_read`` (not in the floor's sum, shown beside it): open, read and
  close the file.

Beside the floor, the least Python the whole per-file work can be, and what the
import's worker spends on it:

* ``straight``: one loop that does, per file, everything a worker must with
  nothing around it (no checker, no bundle, no record object): read the file,
  cut and decode the PEM, parse the leaf, verify its signature, load the key
  from its DER and match it, read the extensions (names, CA flag, OCSP URL),
  the fingerprints, dates and serial, encrypt the key, pack the ``EVALSHA``;
* ``worker``: :func:`~certagent.cli._import_work.prepare_batch` over the same
  files in batches of 200, as a worker process runs it (its checker kept).

``straight`` + ``redis_write`` is the least CPU an import written this way
(Python and cryptography, one Redis) can spend per certificate, with the
importing process counted as free; 10,000 certificates per second on 2 CPUs
allows 200 µs of CPU per certificate for everything, both CPUs busy all the time.

The floor is their sum; divided over the machine's CPUs it is the shortest
time per certificate an import could reach with nothing else done, against the
100 µs per certificate that 10,000 certificates per second allows on 2 CPUs.
"""

from __future__ import annotations

import argparse
import binascii
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hiredis
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bench._runinfo import run_meta, say, write_results
from bench.import_rate import DEFAULT_CACHE, certificates
from certagent.certs.bulkcheck import UploadChecker
from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.certs.validate import UploadPolicy
from certagent.cli._import_work import BatchJob, prepare_batch, read_file
from certagent.store.base import WireRecord
from certagent.store.redis import ADD_SCRIPT, AddCall, Keys, RecordEncoder
from certagent.store.redis._addscript import ADD_SHA
from certagent.testing import RedisProcess
from certagent.testing.processes import cpu_seconds

FLOOR = ("leaf_parse", "leaf_verify", "key_load", "key_match", "key_encrypt", "redis_write")
#: 10,000 certificates per second: one every 100 µs of wall time.
BUDGET_US = 1e6 / 10_000
BATCH = 200


def split(data: bytes) -> tuple[bytes, bytes, bytes]:
    """(leaf PEM, intermediate PEM, key PEM) of a combined file of the bench."""
    end = b"-----END CERTIFICATE-----\n"
    leaf, rest = data.split(end, 1)
    issuer, key = rest.split(end, 1)
    return leaf + end, issuer + end, key


def timed(items: list[Any], work: Callable[[Any], object]) -> float:
    """µs of CPU per item of ``work`` over ``items``."""
    started = time.process_time()
    for item in items:
        work(item)
    return (time.process_time() - started) / len(items) * 1e6


def crypto_pass(paths: list[Path]) -> dict[str, float]:
    datas = [read_file(path) for path in paths]
    parts = [split(data) for data in datas]
    issuer_key = x509.load_pem_x509_certificate(parts[0][1]).public_key()
    assert isinstance(issuer_key, ec.EllipticCurvePublicKey)
    out = {"file_read": timed(paths, read_file)}
    out["leaf_parse"] = timed([p[0] for p in parts], x509.load_pem_x509_certificate)
    leaves = [x509.load_pem_x509_certificate(p[0]) for p in parts]
    signed = [(leaf.signature, leaf.tbs_certificate_bytes) for leaf in leaves]
    ecdsa = ec.ECDSA(hashes.SHA256())
    out["leaf_verify"] = timed(signed, lambda s: issuer_key.verify(s[0], s[1], ecdsa))
    out["key_load"] = timed(
        [p[2] for p in parts], lambda text: serialization.load_pem_private_key(text, None)
    )
    keys = [serialization.load_pem_private_key(p[2], None) for p in parts]
    pairs = [(key.public_key(), leaf) for key, leaf in zip(keys, leaves, strict=True)]
    out["key_match"] = timed(pairs, lambda pair: pair[0] == pair[1].public_key())
    ders = [
        key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        for key in keys
    ]
    data_key = AESGCM.generate_key(256)
    out["key_encrypt"] = timed(
        ders, lambda der: AESGCM(data_key).encrypt(os.urandom(12), der, b"record-v2 0")
    )
    return out


def straight_pass(paths: list[Path]) -> dict[str, float]:
    """``straight`` and ``worker`` (module docstring), µs of CPU per file."""
    issuer_key = x509.load_pem_x509_certificate(split(read_file(paths[0]))[1]).public_key()
    assert isinstance(issuer_key, ec.EllipticCurvePublicKey)
    ecdsa, aead, keys = ec.ECDSA(hashes.SHA256()), AESGCM(AESGCM.generate_key(256)), Keys()
    fixed = (keys.ids(), keys.expiry(), keys.events())
    started = time.process_time()
    for path in paths:
        leaf_pem, _, key_pem = split(read_file(path))
        der, key_der = _der(leaf_pem), _der(key_pem)
        leaf = x509.load_der_x509_certificate(der)
        issuer_key.verify(leaf.signature, leaf.tbs_certificate_bytes, ecdsa)
        key = serialization.load_der_private_key(key_der, None)
        if key.public_key() != leaf.public_key():
            raise AssertionError(f"{path}: the key is not the leaf's")
        names: list[str] = []
        ocsp = None
        for extension in leaf.extensions:
            value = extension.value
            if type(value) is x509.BasicConstraints and value.ca:
                raise AssertionError(f"{path}: a CA certificate")
            if type(value) is x509.SubjectAlternativeName:
                names = [name.lower() for name in value.get_values_for_type(x509.DNSName)]
            elif type(value) is x509.AuthorityInformationAccess:
                ocsp = value
        facts = (
            hashlib.sha1(der, usedforsecurity=False).hexdigest(),
            leaf.serial_number, leaf.not_valid_before_utc, leaf.not_valid_after_utc, ocsp,
        )  # fmt: skip
        cert_id = os.urandom(8).hex()
        nonce = os.urandom(12)
        sealed = nonce + aead.encrypt(nonce, key_der, b"record-v2 " + cert_id.encode())
        hiredis.pack_command(
            (  # type: ignore[arg-type]
                "EVALSHA", ADD_SHA, 6 + len(names),
                keys.fingerprint(hashlib.sha256(der).hexdigest()), keys.cert(cert_id), *fixed,
                keys.chain(b"0" * 32), *[keys.name(name) for name in names],
                cert_id, repr(facts[3].timestamp()), "10000", " ".join(names), der + sealed, b"",
            )
        )  # fmt: skip
    out = {"straight": (time.process_time() - started) / len(paths) * 1e6}
    encoder = RecordEncoder(KeyRing.from_text(generate_key_line()), AddCall(Keys(), 10_000))
    now = datetime.now(UTC)
    jobs = [
        BatchJob(
            tuple((str(p), None) for p in paths[at : at + BATCH]),
            UploadPolicy(), encoder, now, now.replace(microsecond=0),
        )
        for at in range(0, len(paths), BATCH)
    ]  # fmt: skip
    prepare_batch(jobs[0])  # the checker and packer made, as after a worker's first batch
    started = time.process_time()
    for job in jobs:
        prepare_batch(job)
    out["worker"] = (time.process_time() - started) / len(paths) * 1e6
    return out


def _der(block: bytes) -> bytes:
    """The DER of one PEM block (strict base64 between its BEGIN and END lines)."""
    body = block[block.index(b"\n") + 1 : block.rindex(b"-----END ")]
    return binascii.a2b_base64(body.replace(b"\n", b""), strict_mode=True)


def packed_writes(paths: list[Path]) -> list[WireRecord]:
    """Each file's add, packed as the import's workers pack it (not timed)."""
    encoder = RecordEncoder(KeyRing.from_text(generate_key_line()), AddCall(Keys(), 10_000))
    checker = UploadChecker(UploadPolicy())
    now = datetime.now(UTC)
    out: list[WireRecord] = []
    for path in paths:
        record = encoder.encode(checker.validate(read_file(path), None, now=now), now)
        assert isinstance(record, WireRecord)
        out.append(record)
    return out


def redis_pass(records: list[WireRecord], work: Path) -> dict[str, float]:
    """redis-server's CPU per record of the add script, and the wall time of the writes."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with RedisProcess(work) as server, redis.Redis.from_url(server.url) as client:
        assert server.proc is not None
        # a new store is at the newest format, as the store marks it at its first write
        client.hset(Keys().store_format(), "format", 2)
        client.script_load(ADD_SCRIPT)
        conn = client.connection_pool.get_connection()
        try:
            before, started = cpu_seconds(server.proc.pid), time.monotonic()
            for at in range(0, len(records), BATCH):
                batch = records[at : at + BATCH]
                conn.send_packed_command([r.command for r in batch])
                for _ in batch:
                    reply = conn.read_response()
                    assert reply == [1], reply
            seconds = time.monotonic() - started
            used = cpu_seconds(server.proc.pid) - before
        finally:
            client.connection_pool.release(conn)
        assert client.zcard("certagent:ids") == len(records)
    return {"redis_write": used / len(records) * 1e6, "redis_wall": seconds / len(records) * 1e6}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.import_floor", description=__doc__)
    p.add_argument("--count", type=int, default=20_000, help="files (20,000)")
    p.add_argument("--passes", type=int, default=3, help="passes of each (3)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=None, help="write results there too")
    args = p.parse_args(argv)
    source = certificates(args.cache, args.count, "ec", True)
    paths = sorted(source.glob("*.pem"))[: args.count]
    say(f"import_floor: packing {len(paths):,} writes ...")
    records = packed_writes(paths)
    load_before = os.getloadavg()[0]
    passes: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="import-floor-") as tmp:
        for n in range(args.passes):
            say(f"import_floor: pass {n + 1}/{args.passes}")
            passes.append(
                {
                    **crypto_pass(paths),
                    **straight_pass(paths),
                    **redis_pass(records, Path(tmp) / "redis"),
                }
            )
    medians = {k: round(statistics.median(r[k] for r in passes), 1) for k in passes[0]}
    spread = {k: [round(min(r[k] for r in passes), 1), round(max(r[k] for r in passes), 1)]
              for k in passes[0]}  # fmt: skip
    floor = round(sum(medians[k] for k in FLOOR), 1)
    cpus = os.cpu_count() or 1
    result: dict[str, Any] = {
        "benchmark": "cert import: the floor of CPU per certificate (µs)",
        "meta": run_meta(),
        "argv": sys.argv[1:] if argv is None else argv,
        "files": len(paths),
        "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "medians_us": medians,
        "min_max_us": spread,
        "floor_us": floor,
        "floor_with_read_us": round(floor + medians["file_read"], 1),
        "cpus": cpus,
        "floor_per_cert_over_cpus_us": round(floor / cpus, 1),
        "budget_per_cert_us": BUDGET_US,
        "rate_ceiling_per_s": round(cpus / floor * 1e6),
        "least_python_us": round(medians["straight"] + medians["redis_write"], 1),
        "least_python_ceiling_per_s": round(
            cpus / (medians["straight"] + medians["redis_write"]) * 1e6
        ),
        "passes": passes,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        stem = f"{result['meta']['date'][:10]}-import-floor"
        written = write_results(args.out, stem, text, markdown(result))
        say(f"import_floor: wrote {written}")
    return 0


def markdown(result: dict[str, Any]) -> str:
    m, spread = result["medians_us"], result["min_max_us"]
    rows = [f"| {k} | {m[k]} | {spread[k][0]}-{spread[k][1]} |" for k in (*FLOOR, "file_read")]
    lines = [
        f"# cert import: the floor of CPU per certificate, {result['meta']['date'][:10]}",
        "",
        f"`python -m bench.import_floor {' '.join(result['argv'])}` at"
        f" {result['meta']['revision']}; {result['files']:,} files (ECDSA P-256, own key, one"
        f" shared intermediate); each operation alone in a loop, median (min-max) of"
        f" {len(result['passes'])} passes; load average {result['loadavg_1min'][0]}-"
        f"{result['loadavg_1min'][1]} on {result['cpus']} CPUs.",
        "",
        "| operation | µs per certificate | min-max |",
        "|---|---:|---:|",
        *rows,
        "",
        f"Floor (the first six): {result['floor_us']} µs of CPU per certificate"
        f" ({result['floor_with_read_us']} with the file read); over {result['cpus']} CPUs"
        f" {result['floor_per_cert_over_cpus_us']} µs per certificate, against the"
        f" {result['budget_per_cert_us']:.0f} µs that 10,000/s allows: at most"
        f" {result['rate_ceiling_per_s']:,} certificates/s with nothing else done."
        f" redis_write's wall time per record, sent 200 at a time: {m['redis_wall']} µs.",
        "",
        "| the whole per-file work | µs per certificate | min-max |",
        "|---|---:|---:|",
        f"| straight: one plain loop, nothing around it | {m['straight']} |"
        f" {spread['straight'][0]}-{spread['straight'][1]} |",
        f"| worker: `prepare_batch`, as the import runs it | {m['worker']} |"
        f" {spread['worker'][0]}-{spread['worker'][1]} |",
        "",
        f"The least Python the import can be, with Redis: straight + redis_write ="
        f" {result['least_python_us']} µs of CPU per certificate (the importing process"
        f" counted as free), against the {result['cpus'] * result['budget_per_cert_us']:.0f}"
        f" µs that 10,000/s allows on {result['cpus']} CPUs busy all the time: at most"
        f" {result['least_python_ceiling_per_s']:,} certificates/s.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
