"""An engine's processes: the members of its process group (the launcher starts each engine in its own).

What the transfer benchmark and any job that shares a host between engines does with them: list the
members (``group_processes``), pin every thread to a core set (``pin_group``, cores written as
``VLLM_CPU_OMP_THREADS_BIND`` writes them: ``parse_cores``), and find the stopped ones (``stopped_pids``,
for a watchdog's verdict).
"""

from __future__ import annotations

import contextlib
import os

import psutil

__all__ = ["group_processes", "parse_cores", "pin_group", "stopped_pids"]


def parse_cores(text: str) -> set[int]:
    """``"0"``, ``"0-3"``, ``"0,2"`` → a core set (VLLM_CPU_OMP_THREADS_BIND syntax, one NUMA group)."""
    cores: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def group_processes(pgid: int) -> list[psutil.Process]:
    """The live processes of process group ``pgid`` (zombies left out), with ``pid``, ``name`` and
    ``status`` read into ``proc.info``; one that exits while it is listed is left out."""
    out = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                out.append(proc)
        except (psutil.Error, OSError):
            continue
    return out


def pin_group(pgid: int, cores: set[int]) -> int:
    """Pin every thread of every live process in process group ``pgid`` to ``cores``; threads pinned."""
    pinned = 0
    for proc in group_processes(pgid):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{proc.pid}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cores)
                    pinned += 1
    return pinned


def stopped_pids(pgid: int | None) -> list[int]:
    """Processes of group ``pgid`` in the stopped state (SIGSTOP, or a debugger)."""
    if pgid is None:
        return []
    return [p.pid for p in group_processes(pgid) if p.info["status"] == psutil.STATUS_STOPPED]
