"""Reading ``perf record`` data of the HAProxy worker: where its time went.

HAProxy, libcrypto and libssl are stripped, so only exported symbols resolve.  Each
sample is attributed to the *entry point*: the library function HAProxy called,
found from the call sites in ``objdump -d /usr/sbin/haproxy``.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

_CALL = re.compile(r"\s*([0-9a-f]+):\s+call\S*\s+[0-9a-f]+\s+<([^>]+)>")
_INSN = re.compile(r"\s*([0-9a-f]+):\s")
_LIBC_INLINE = re.compile(r"_*(pthread|GI_|libc|int_|unlink_chunk|malloc|free|cfree|mem|str)")
_MALLOC = re.compile(r"_*(GI___libc_)?(malloc|calloc|realloc|free|cfree|_?int_|unlink_chunk)")
_FRAME = re.compile(r"\s*([0-9a-f]+)\s+(.+?)\s+\(([^()]*)\)\s*$")
SAMPLE_HZ = 999.0
#: Frames of HAProxy's scheduler, left out of the inclusive list (every sample has them).
SCHEDULER = (
    "clone3",
    "start_thread",
    "run_poll_loop",
    "process_runnable_tasks",
    "run_tasks_from_lists",
    "task_run_applet",
)


class Frame(NamedTuple):
    ip: int
    sym: str  # "" when unknown
    dso: str


def haproxy_callsites(binary: str = "/usr/sbin/haproxy") -> dict[int, str]:
    """Return address -> called function, for every call to a named (PLT or exported) function."""
    try:
        text = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", binary],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    sites: dict[int, str] = {}
    pending: str | None = None
    for line in text.splitlines():
        insn = _INSN.match(line)
        if insn is None:
            continue
        if pending is not None:  # this instruction is where the call returns to
            sites[int(insn.group(1), 16)] = pending
            pending = None
        call = _CALL.match(line)
        if call is not None:
            target = call.group(2)
            if target.endswith("@plt"):
                pending = target[:-4]
            elif "@@" in target and "+" not in target:
                pending = target.split("@@")[0]
    return sites


def read_samples(perf: str, data: Path) -> list[list[Frame]]:
    """Every sample's frames, leaf first, from ``perf script``."""
    res = subprocess.run(
        [perf, "script", "-i", str(data), "-F", "ip,sym,symoff,dso"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    samples: list[list[Frame]] = []
    frames: list[Frame] = []
    for line in res.stdout.splitlines():
        if not line.strip():
            if frames:
                samples.append(frames)
                frames = []
            continue
        match = _FRAME.match(line)
        if match is None:
            continue  # inlined frames carry no dso
        sym = match.group(2)
        sym = "" if sym.startswith("[unknown]") else re.sub(r"\+0x[0-9a-f]+$", "", sym)
        frames.append(Frame(int(match.group(1), 16), sym, os.path.basename(match.group(3))))
    if frames:
        samples.append(frames)
    for frames in samples:
        _give_inlined_frames_a_dso(frames)
    return samples


def _give_inlined_frames_a_dso(frames: list[Frame]) -> None:
    """perf lists inlined frames before the frame they were inlined into (same ip): give
    them that frame's DSO."""
    for i in range(len(frames) - 1, -1, -1):
        if frames[i].dso == "inlined":
            if _LIBC_INLINE.match(frames[i].sym):
                dso = "libc.so.6"  # glibc's own inlined helpers (rwlock, malloc, send)
            else:
                dso = next((f.dso for f in frames[i + 1 :] if f.dso != "inlined"), "?")
            frames[i] = frames[i]._replace(dso=dso)


def _entry_point(frames: list[Frame], callsites: dict[int, str]) -> str:
    """The innermost HAProxy frame whose return address is a known call site."""
    if frames[0].dso == "haproxy":
        return f"(HAProxy's own code) {frames[0].sym or 'static fn'}"
    for ip, sym, dso in frames[1:]:
        # perf prints a caller frame's return address minus one
        site = callsites.get(ip + 1) or callsites.get(ip)
        if dso == "haproxy" and site is not None:
            return f"{site}  <- {sym or 'haproxy (static fn)'}"
    return "(no HAProxy->library call found)"


def _self_symbol(frames: list[Frame]) -> str:
    """The leaf's symbol, or the nearest exported caller's, marked ``~``."""
    first = next(((i, f) for i, f in enumerate(frames) if f.sym), None)
    if first is None:
        return f"[unknown] {frames[0].dso}"
    depth, frame = first
    return ("" if depth == 0 else "~") + f"{frame.sym} ({frame.dso})"


def perf_summary(perf: str, data: Path, callsites: dict[int, str], ops: int) -> dict[str, Any]:
    """Entry points (HAProxy -> library calls), self time folded to exported symbols, inclusive."""
    samples = read_samples(perf, data)
    total = len(samples)
    if total == 0:
        return {"samples": 0}
    by_dso: Counter[str] = Counter()
    folded: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    entry: Counter[str] = Counter()
    entry_decoder: Counter[str] = Counter()
    shares = dict.fromkeys(
        (
            "OSSL_DECODER_CTX_new_for_pkey (inclusive)",
            "OSSL_DECODER_from_bio (inclusive)",
            "pthread_rwlock_* (self)",
            "malloc/free (self)",
            "kernel (self)",
        ),
        0,
    )
    for frames in samples:
        leaf = frames[0]
        by_dso[leaf.dso] += 1
        folded[_self_symbol(frames)] += 1
        for name in {f"{f.sym} ({f.dso})" for f in frames if f.sym}:
            inclusive[name] += 1
        label = _entry_point(frames, callsites)
        entry[label] += 1
        symbols = {f.sym for f in frames}
        if "OSSL_DECODER_CTX_new_for_pkey" in symbols:
            entry_decoder[label] += 1
            shares["OSSL_DECODER_CTX_new_for_pkey (inclusive)"] += 1
        if "OSSL_DECODER_from_bio" in symbols:
            shares["OSSL_DECODER_from_bio (inclusive)"] += 1
        if leaf.sym.startswith(("pthread_rwlock", "__pthread_rwlock")):
            shares["pthread_rwlock_* (self)"] += 1
        if _MALLOC.match(leaf.sym):
            shares["malloc/free (self)"] += 1
        if leaf.dso.startswith("[kernel"):
            shares["kernel (self)"] += 1

    def pct(n: int) -> float:
        return round(100.0 * n / total, 1)

    def top(counts: Counter[str], k: int) -> list[dict[str, Any]]:
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:k]
        return [{"pct": pct(v), "sym": name} for name, v in ranked]

    entries = [
        {
            "pct": pct(v),
            "us_per_op": round(v / SAMPLE_HZ * 1e6 / max(ops, 1), 1),
            "entry": name,
            "of_which_decoder_ctx_pct": pct(entry_decoder.get(name, 0)),
        }
        for name, v in sorted(entry.items(), key=lambda kv: -kv[1])[:15]
    ]
    beyond_scheduler = [r for r in top(inclusive, 60) if r["sym"].split(" ")[0] not in SCHEDULER]
    return {
        "samples": total,
        "by_dso_self": top(by_dso, 8),
        "entry_points": entries,
        "self_folded": top(folded, 20),
        "inclusive": beyond_scheduler[:30],
        "shares_pct": {k: pct(v) for k, v in shares.items()},
        "_incl_counts": {k: v for k, v in inclusive.items() if v >= 3},
        "_ops": ops,
    }


def profile_diff(first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, Any]]:
    """Symbols whose inclusive time per handshake grew most from the second to the first."""
    ops_a, ops_b = first.get("_ops", 1), second.get("_ops", 1)
    a, b = first.get("_incl_counts", {}), second.get("_incl_counts", {})
    rows = []
    for name in set(a) | set(b):
        us_a = a.get(name, 0) / SAMPLE_HZ * 1e6 / ops_a
        us_b = b.get(name, 0) / SAMPLE_HZ * 1e6 / ops_b
        rows.append(
            {
                "sym": name,
                "first_us": round(us_a, 1),
                "second_us": round(us_b, 1),
                "diff_us": round(us_a - us_b, 1),
            }
        )
    rows.sort(key=lambda r: -r["diff_us"])
    return rows[:20]
