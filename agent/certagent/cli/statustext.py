"""``certagent status`` as text: the agent's status answer, one line per part."""

from __future__ import annotations

import time
from typing import Any

from certagent.runtime.build import HAProxyBuild

__all__ = ["print_status"]


def print_status(st: dict[str, Any]) -> None:
    """The agent's ``status`` answer as text: one line per part, its counters."""
    e, ld = st["ensure"], st["loader"]
    print(f"agent pid      {st['agent_pid']}")
    up = {True: "up", False: "DOWN"}
    build = st.get("haproxy_build")
    what = (
        HAProxyBuild(build["version"], build["openssl"], build["lua"]).describe()
        if build
        else f"HAProxy {st['haproxy_version']}"
    )
    print(f"haproxy        {up[st['haproxy_up']]}, pid {st['haproxy_pid']} ({what})")
    for note in build["differences"] if build else ():
        print(f"  this version {note}")
    print(f"store          {up[st['store_up']]}, {st['store']}")
    fleet = st.get("fleet")
    if fleet:
        stored = fleet["store_format"]
        print(
            f"fleet          node {fleet['node']}, certagent {fleet['version']}, writes store"
            f" format {stored if stored is not None else 'unknown yet'}"
            " (certagent fleet status: every node)"
        )
    print(
        f"slots          {st['slots_used']} / {st['capacity']}"
        f" ({st['hosts_marked']} hosts marked loaded)"
    )
    print(
        f"requests       {e['requests']}: hits {e['hits']}, loaded {e['loaded']},"
        f" unknown {e['unknown']} (+{e['negative_hits']} cached), busy {e['busy']},"
        f" invalid {e['invalid']}, errors {e['errors']}"
    )
    print(
        f"haproxy loads  {ld['loads']} ({ld['recycles']} recycled slots,"
        f" {ld['mark_only']} mark-only), failures {ld['failures']}, resyncs {ld['resets']}"
    )
    acme = st.get("issuance")
    if acme:
        failed = ", ".join(f"{r} {n}" for r, n in sorted(acme["failed_by_reason"].items()))
        print(
            f"issuance       from {acme['account']['directory']}: {acme['pending']} in progress,"
            f" orders {acme['orders_valid']} valid / {acme['orders_failed']} failed"
            + (f" ({failed})" if failed else "")
            + f", {acme['fallbacks']} first connections got the fallback"
        )
        pm = acme["permission"]
        print(
            f"  permission   {'; '.join(pm['policies'])}: allowed {pm['allowed']},"
            f" denied {pm['denied']} ({pm['cached']} answers cached)"
        )
        ch = acme["challenges"]
        print(f"  challenges   {ch['serving']} answered by this node now, {ch['answered']} in all")
        _print_renewal(acme.get("renewal"))
    h3 = st.get("http3")
    if h3:
        quic = h3["quic"]
        seen = (
            f"{quic['connections']} connections, {quic['requests']} requests,"
            f" {quic['refused']} refused handshakes (closes)"
            if quic
            else "QUIC counters unreadable"
        )
        idle = h3["recycled_idle_s"]
        recycled = (
            f"recycled slots had been idle min {idle['min']} s, p10 {idle['p10']} s,"
            f" median {idle['median']} s (latest {idle['recycles']})"
            if idle["recycles"]
            else "no slot recycled yet"
        )
        print(
            f"http3          {seen}; {h3['returns']} recycled hosts back within max-age"
            f" {h3['max_age']} s; {recycled}"
        )
    tk = st.get("tickets")
    if tk:
        where = {True: "in HAProxy", False: "NOT in HAProxy (haproxy.cfg lacks them)"}
        print(
            f"ticket keys    generation {tk['generation']}, {where.get(tk['in_haproxy'], '?')},"
            f" next rotation in {_until(tk['next_rotation'])}, ring in {tk['store']}"
        )
    _print_data_keys(st.get("data_keys"))


def _print_data_keys(dk: dict[str, Any] | None) -> None:
    """The data keys this agent holds, and the records it could not decrypt (5 shown)."""
    if not dk:
        return
    print(
        f"data keys      {' '.join(dk['key_ids'])} (the first is current),"
        f" announced as {dk['node']}"
    )
    unreadable = dk["undecryptable"]["records"]
    if unreadable:
        print(
            f"  UNDECRYPTABLE {len(unreadable)} record(s) this key file cannot decrypt"
            " (their hosts get the fallback; --json lists them all):"
        )
        for record in unreadable[:5]:
            print(f"    {record['name']}: record {record['id']}, data key {record['key_id']}")


def _until(when: float | None) -> str:
    if when is None:
        return "?"
    left = max(0, int(when - time.time()))
    return f"{left // 3600}h{left % 3600 // 60:02d}m"


def _clearing(backlog: int, clear_seconds: float | None, renewed_by: str = "here") -> str:
    if not backlog:
        return "nothing to clear"
    if clear_seconds is None:
        return f"nothing renewed {renewed_by} in the last 5 min"
    return f"cleared in {clear_seconds:.0f} s at this pace"


def _print_renewal(rn: dict[str, Any] | None) -> None:
    """``status``: the renewal schedule, this node's renewals, overdue and failing names."""
    if rn is None:
        print("  renewal      off on this node (renew_tick = 0)")
        return
    if "error" in rn:
        print(f"  renewal      schedule unknown: {rn['error']}")
        return
    print(
        f"  renewal      {rn['scheduled']} scheduled, {rn['due']} due, {rn['overdue']} overdue,"
        f" {rn['failing']} failing here; renewed here {rn['done']}, failed {rn['failed']}"
    )
    if "pace" in rn:  # agents before 0.3.0 do not say
        late = " (renewals late: raised)" if rn["late"] else ""
        print(
            f"    pace       {rn['pace'] * 60:.1f} renewals a minute here (last 5 min),"
            f" {rn['running']} running of {rn['concurrency']}{late};"
            f" backlog {rn['backlog']}, {_clearing(rn['backlog'], rn['clear_seconds'])}"
        )
    if "fleet_pace" in rn:
        print(
            f"    fleet      {rn['fleet_pace'] * 60:.1f} renewals a minute on"
            f" {rn['fleet_renewing_nodes']} renewing node(s);"
            f" {_clearing(rn['backlog'], rn['fleet_clear_seconds'], 'by the fleet')}"
        )
    for entry in rn["overdue_names"]:
        print(
            f"    overdue    {entry['name']}: renewal due since {entry['renew_at']},"
            f" expires {entry['expires'] or 'unknown'}"
        )
    for name, failing in rn["failing_names"].items():
        print(
            f"    failing    {name}: {failing['failures']} in a row ({failing['reason']}),"
            f" expires {failing['expires']}, next attempt {failing['next_attempt']}"
        )
