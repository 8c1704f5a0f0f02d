"""q2: what the form of a load's payload costs HAProxy (key encoding, chain, block order).

Every variant of :func:`~bench.profile_load.payloads.payload_variants` goes into one
listed slot, ``set ssl cert`` alone and the agent's set + commit + abort, in a
shuffled order per repetition; each is compared with the agent's own form within
the same repetition.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from bench import _runtime_api as api
from bench.profile_load.handshakes import verified_handshake
from bench.profile_load.payloads import AGENT_FORM, ISSUERS_HOST, payload_variants
from bench.profile_load.rig import ProfiledHAProxy, slot
from bench.profile_load.session import ratio_summary, summary
from bench.profile_load.settings import say


def payload_costs(rig: ProfiledHAProxy) -> dict[str, Any]:
    params = rig.params
    variants = payload_variants(rig.certs)
    target = slot(0)
    n = params.n_variant
    say(f"q2: {len(variants)} payload variants, {params.reps} reps, N={n}, into slot {target}")
    verified: dict[str, Any] = {}
    for name, variant in variants.items():  # every variant must load and commit
        rig.session.run(api.load(target, variant["payload"]), f"q2 variant {name} does not load")
        if name == "ec-leafonly-issuers":
            verified = verified_handshake(rig, ISSUERS_HOST)
    set_us: dict[str, list[float]] = {name: [] for name in variants}
    load_us: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(params.reps):
        rig.budget.check(f"q2 rep {rep}", 5)
        rig.alive()
        order = list(variants)
        random.Random(rep).shuffle(order)
        for name in order:
            payload = variants[name]["payload"]
            set_us[name].append(
                rig.meter.timed([api.set_cert(target, payload)] * n, n, f"q2 set {name}")
            )
            rig.session.run([api.abort_open(target)], "q2 abort")
            load_us[name].append(
                rig.meter.timed(api.load(target, payload) * n, n, f"q2 load {name}")
            )
    out: dict[str, Any] = {}
    for name, variant in variants.items():
        set_ratio = [a / b for a, b in zip(set_us[name], set_us[AGENT_FORM], strict=True)]
        load_ratio = [a / b for a, b in zip(load_us[name], load_us[AGENT_FORM], strict=True)]
        out[name] = {
            "what": variant["what"],
            "payload_bytes": variant["bytes"],
            "set": summary(set_us[name]),
            "set+commit+abort": summary(load_us[name]),
            "set_ratio_to_agent_today": ratio_summary(set_ratio),
            "load_ratio_to_agent_today": ratio_summary(load_ratio),
        }
    return {
        "slot": target,
        "n": n,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "issuers_chain_path_verified_handshake": verified,
        "variants": out,
    }
