"""``--build-nice``: one build's agent at a lower CPU priority than its HAProxy.

What an operator would do with systemd's ``Nice=`` or ``CPUWeight=``: HAProxy's handshakes
keep the CPU, the agent gets what they leave.  Applied to every thread of the agent once it
answers (threads it starts later inherit it from the thread that starts them):

- ``N`` (an integer): the normal scheduler at nice ``N``.  Every process here is started in
  a session of its own, so with autogroup scheduling (Linux's default) nice alone would only
  weigh the agent's threads against each other: the agent's autogroup gets nice ``N`` too
  (``/proc/<pid>/autogroup``, root), which weighs it against HAProxy's as ``CPUWeight=``
  weighs two services' cgroups (nice 5: about a third of HAProxy's weight, nice 10: a tenth).
  The autogroup's value is ``N`` above this process's own: under ``--favour`` (every autogroup
  of the bench at -20, which sets the agent's long before it answers) the agent's is
  ``N - 20``, still ``N`` below HAProxy's and far above other sessions' work.
  Under ``--realtime`` the agent so leaves SCHED_RR for the normal scheduler: it then runs
  only when HAProxy, the clients and the prober leave a CPU idle, and competes there with
  the machine's other work.
- ``rt``: under ``--realtime`` only, SCHED_RR one priority below HAProxy and the clients
  (still above the machine's other work).
"""

from __future__ import annotations

import os

from bench.versions.favour import autogroup_nice, set_autogroup_nice

RT = "rt"


def parse(value: str) -> tuple[str, str]:
    """``"3.2nice=10"`` or ``"3.2rt=rt"`` -> (label, setting); SystemExit if malformed."""
    label, sep, setting = value.partition("=")
    if not sep or not label or not (setting == RT or _nice(setting) is not None):
        raise SystemExit("bench.versions: --build-nice takes LABEL=N (nice -20..19) or LABEL=rt")
    return label, setting


def _nice(setting: str) -> int | None:
    try:
        n = int(setting)
    except ValueError:
        return None
    return n if -20 <= n <= 19 else None


def lower(pid: int, setting: str, realtime: bool, rt_priority: int) -> None:
    """Every thread of ``pid`` at ``setting`` (see the module); ``rt_priority``: HAProxy's."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    if setting == RT:
        if not realtime:
            raise SystemExit("bench.versions: --build-nice LABEL=rt needs --realtime")
        for tid in tids:
            os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(rt_priority - 1))
        return
    nice = int(setting)
    for tid in tids:
        if realtime:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    if autogroup_nice(pid) is not None:  # no autogroups (a container): nice alone weighs it
        # this process shows no autogroup of its own where it never started a session (it is
        # then in the kernel's default group, at nice 0) while the agent, which did, has one
        own = autogroup_nice() or 0
        set_autogroup_nice(pid, max(-20, min(19, own + nice)))


def describe(pid: int) -> dict[str, object]:
    """The agent's main thread's policy, nice and autogroup, as applied (for the row)."""
    policy = os.sched_getscheduler(pid)
    return {
        "policy": {os.SCHED_OTHER: "other", os.SCHED_RR: "rr"}.get(policy, str(policy)),
        "rt_priority": os.sched_getparam(pid).sched_priority,
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "autogroup": None if (group := autogroup_nice(pid)) is None else str(group),
    }
