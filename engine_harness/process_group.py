"""An engine's process group: every launched engine is a group leader, stopped with its children.

Its lifetime: ``_kill_group`` sends SIGTERM to the whole group and SIGKILL after a grace period; an
``atexit`` hook does the same for any engine still alive when the interpreter leaves (Ctrl-C included),
and the child asks the kernel for SIGTERM when the suite's process dies (Linux), so no engine outlives
the suite. Its temporary files: each engine gets a scratch folder of its own as ``TMPDIR``
(``engine_scratch``), removed with the group, because vLLM and SGLang leave their ZMQ sockets and
``vllm_dist_*`` folders in the temporary folder even on a clean stop (seven sockets and a folder per
vLLM 0.32 start, measured), and nothing of a run may outlive it outside its output folder.

Its members, for a job that shares a host between engines: listed (``group_processes``), every thread
pinned to a core set (``pin_group``, cores written as ``VLLM_CPU_OMP_THREADS_BIND`` writes them:
``parse_cores``), and the stopped ones found (``stopped_pids``, for a watchdog's verdict).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import filelock
import psutil

__all__ = [
    "_LIVE",
    "CorePlan",
    "_kill_group",
    "child_preexec",
    "core_text",
    "drop_scratch",
    "engine_scratch",
    "group_processes",
    "isolation_plan",
    "parse_cores",
    "pin_group",
    "pin_process",
    "stopped_pids",
]

_LIVE: dict[subprocess.Popen[bytes], Path] = {}  # engines launched and not yet stopped: their scratch
_HELD: dict[Path, filelock.BaseFileLock] = {}  # the scratch folders this process owns: their locks
_OWNER_LOCK = ".owner.lock"
_SETUP_S = 60.0  # a scratch folder younger than this may be one another process has not locked yet
_PR_SET_PDEATHSIG = 1


def engine_scratch() -> Path:
    """A new, empty folder for one engine's temporary files (its ``TMPDIR``), in the system's temporary
    folder: the engines put Unix sockets there, whose paths may not pass 107 bytes, which a folder under a
    run's output folder could. This process holds a lock on it (``.owner.lock``) until ``drop_scratch``
    removes it (``_kill_group``, with the engine registered in ``_LIVE``); a suite process killed outright
    cannot remove it, so each new one first removes those whose lock no process holds (``_abandoned``)."""
    root = Path(tempfile.gettempdir())
    for stale in root.glob("microbench-engine-*-*"):
        if stale.is_dir() and _abandoned(stale):
            shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"microbench-engine-{os.getpid()}-", dir=root))
    lock = filelock.FileLock(scratch / _OWNER_LOCK, thread_local=False)  # let go by the thread that stops it
    lock.acquire()
    _HELD[scratch] = lock
    return scratch


def _abandoned(folder: Path) -> bool:
    """No process holds the folder's lock and it is old enough not to be one still being set up.

    The lock, not the process id in the name: a process of another PID namespace sharing this temporary
    folder (two containers) has an id that means nothing here, and its lock still holds; the kernel drops
    a lock with its process, however it died."""
    try:
        if time.time() - folder.stat().st_mtime < _SETUP_S:
            return False
    except OSError:
        return False
    lock = filelock.FileLock(folder / _OWNER_LOCK, thread_local=False)
    try:
        lock.acquire(timeout=0)
    except (filelock.Timeout, OSError):
        return False
    lock.release()
    return True


def drop_scratch(scratch: Path) -> None:
    """Remove an engine's scratch folder and let go of its lock."""
    shutil.rmtree(scratch, ignore_errors=True)
    lock = _HELD.pop(scratch, None)
    if lock is not None:
        lock.release()


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group, wait up to ``grace_s``, then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    # The leader may be gone while its children (engine cores, workers) linger in the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    # SIGKILL is delivered, not yet done: a member may still be exiting (a busy box takes its time), and
    # a stop that returns before the group is gone lets the next engine start beside it.
    deadline = time.monotonic() + 5
    while group_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    scratch = _LIVE.pop(proc, None)
    if scratch is not None:
        drop_scratch(scratch)


@atexit.register
def _reap_all() -> None:
    for proc in list(_LIVE):
        _kill_group(proc, grace_s=5)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the suite's process dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def child_preexec(cores: Iterable[int] | None = None) -> Callable[[], None]:
    """A child's pre-exec (``subprocess.Popen(preexec_fn=…)``, Linux): die with this process and, given
    ``cores``, start on them (an isolated worker's host cores, a benchmark's pinned server)."""
    if cores is None:
        return _die_with_parent
    pinned = frozenset(cores)

    def preexec() -> None:
        _die_with_parent()
        os.sched_setaffinity(0, pinned)

    return preexec


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


def core_text(cores: Iterable[int]) -> str:
    """``{0, 1, 2, 5}`` → ``"0-2,5"`` (the ``VLLM_CPU_OMP_THREADS_BIND`` syntax, ``parse_cores``' input)."""
    out: list[str] = []
    run: list[int] = []
    for core in sorted(set(cores)):
        if run and core != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(core)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


@functools.cache
def _allowed_cores() -> frozenset[int]:
    """The cores this process could run on when first asked (before any isolation pinned it)."""
    return frozenset(os.sched_getaffinity(0))


@dataclass(frozen=True)
class CorePlan:
    """An isolated worker: its threads alone on ``worker``; the engine's other processes and the client
    that launched it on ``host``."""

    worker: frozenset[int]
    host: frozenset[int]


def isolation_plan(bind: str | None) -> CorePlan:
    """The cores of an isolated worker: ``bind`` (``VLLM_CPU_OMP_THREADS_BIND`` syntax), else every core
    this process may use but the last, which vLLM's own automatic binding leaves to its scheduler; the rest
    are the host's. ``ValueError`` where either side would be empty or ``bind`` names a core not allowed."""
    allowed = _allowed_cores()
    worker = frozenset(parse_cores(bind)) if bind and bind != "auto" else frozenset(sorted(allowed)[:-1])
    host = allowed - worker
    if not worker or not host or not worker <= allowed:
        raise ValueError(
            f"isolate_worker needs the worker's cores ({core_text(worker) or 'none'}) among this process's "
            f"cores ({core_text(allowed)}) with at least one left for the rest; give cpu_threads_bind a "
            "smaller set, or run without isolate_worker"
        )
    return CorePlan(worker, host)


def parse_cores(text: str) -> set[int]:
    """``"0"``, ``"0-3"``, ``"0,2"`` → a core set (VLLM_CPU_OMP_THREADS_BIND syntax, one NUMA group)."""
    cores: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def pin_group(pgid: int, cores: set[int]) -> int:
    """Pin every thread of every live process in process group ``pgid`` to ``cores``; threads pinned."""
    return sum(pin_process(proc.pid, cores) for proc in group_processes(pgid))


def pin_named(pgid: int, name: str, cores: set[int]) -> int:
    """Pin every thread of the processes of group ``pgid`` named ``name`` (a process title, matched on the
    15 characters the kernel keeps of it) to ``cores``; processes pinned."""
    named = [p for p in group_processes(pgid) if (p.info["name"] or "")[:15] == name[:15]]
    return sum(pin_process(p.pid, cores) > 0 for p in named)


def pin_process(pid: int, cores: Iterable[int]) -> int:
    """Pin every thread of process ``pid`` to ``cores`` (one thread's affinity is its own: a process's
    threads started before keep theirs otherwise); threads pinned."""
    pinned = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), set(cores))
                pinned += 1
    return pinned


def stopped_pids(pgid: int | None) -> list[int]:
    """Processes of group ``pgid`` in the stopped state (SIGSTOP, or a debugger)."""
    if pgid is None:
        return []
    return [p.pid for p in group_processes(pgid) if p.info["status"] == psutil.STATUS_STOPPED]
