"""Idle CPU of an engine, sampled with psutil: how much of its core an engine burns while serving nothing.

An engine's processes are the members of its process group (the launcher starts each engine in its own
group). ``sample_idle_cpu`` reads every thread's user+system CPU time twice, ``seconds`` apart, and
reports the busy share of one core in percent, in total, per process and per thread name (``comm``), so
a busy-polling thread (NIXL/UCX progress, an engine loop) is named, not guessed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict

import psutil
from pydantic import Field

from benchcore.schema import StrictModel as Record
from engine_harness.process_group import group_processes

__all__ = [
    "SPINNER_PCT",
    "IdleCpu",
    "deprioritize_spinners",
    "group_threads",
    "idle_cpu_between",
    "sample_idle_cpu",
]

SPINNER_PCT = 50.0  # a thread using more than half a core while its engine serves nothing is spinning

ThreadTimes = dict[tuple[int, int], tuple[str, str, float]]  # (pid, tid) -> (process, thread, cpu s)


class IdleCpu(Record):
    """Busy share of one core (%) of an engine's processes over an idle window."""

    role: str
    seconds: float = Field(gt=0, description="length of the sampling window")
    total_pct: float = Field(ge=0, description="all threads of the engine's process group, % of one core")
    per_process_pct: dict[str, float] = Field(description="by process name")
    deprioritized: list[str] = Field(
        default_factory=list, description="threads moved to SCHED_IDLE after this sample (spinners)"
    )
    top_threads_pct: dict[str, float] = Field(
        description="busiest threads (process/thread name#tid), % of a core; native threads often carry "
        "their creator's name, so the tid tells them apart"
    )


def _thread_name(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def group_threads(pgid: int) -> ThreadTimes:
    """CPU seconds (user + system) of every thread of every process in process group ``pgid``."""
    out: ThreadTimes = {}
    for proc in group_processes(pgid):
        try:
            name = proc.info["name"] or str(proc.pid)
            for th in proc.threads():
                out[(proc.pid, th.id)] = (name, _thread_name(proc.pid, th.id), th.user_time + th.system_time)
        except (psutil.Error, OSError):
            continue
    return out


def idle_cpu_between(
    role: str, before: ThreadTimes, after: ThreadTimes, seconds: float, top: int = 6
) -> IdleCpu:
    """The busy shares from two ``group_threads`` readings ``seconds`` apart (pure)."""
    by_proc: dict[str, float] = defaultdict(float)
    by_thread: dict[str, float] = defaultdict(float)
    for key, (proc, thread, cpu) in after.items():
        used = cpu - before[key][2] if key in before else 0.0
        pct = max(used, 0.0) / seconds * 100
        by_proc[proc] += pct
        by_thread[f"{proc}/{thread}#{key[1]}"] += pct  # threads inherit their creator's name: keep the tid
    busiest = sorted(by_thread.items(), key=lambda kv: -kv[1])[:top]
    return IdleCpu(
        role=role,
        seconds=seconds,
        total_pct=round(sum(by_proc.values()), 1),
        per_process_pct={k: round(v, 1) for k, v in sorted(by_proc.items())},
        top_threads_pct={k: round(v, 1) for k, v in busiest},
    )


async def sample_idle_cpu(roles: dict[str, int], seconds: float = 5.0) -> dict[str, IdleCpu]:
    """Idle CPU of several engines at once (role -> process-group id), over the same window."""
    before = {role: group_threads(pgid) for role, pgid in roles.items()}
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - t0
    return {
        role: idle_cpu_between(role, before[role], group_threads(pgid), elapsed)
        for role, pgid in roles.items()
    }


def deprioritize_spinners(idle: IdleCpu) -> list[str]:
    """Move the threads that spin while idle to ``SCHED_IDLE``: they then run only when nothing else on
    their core wants to. (The NIXL UCX progress thread is one: NIXL's Python API starts it with
    ``pthrDelay = 0``, a zero-timeout ``poll()`` loop, and no setting reaches that value.)"""
    moved = []
    for name, pct in idle.top_threads_pct.items():
        tid = int(name.rsplit("#", 1)[1]) if "#" in name else None
        if tid is None or pct < SPINNER_PCT:
            continue
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            continue
        moved.append(name)
    return moved
