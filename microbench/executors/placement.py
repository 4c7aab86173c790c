"""Placement honesty (DESIGN §7): which device a shard measured on, and cores it owns on a CPU-only node.

Ray's ``num_gpus=1`` gives a task its own GPU (Ray sets ``CUDA_VISIBLE_DEVICES``); ``num_cpus`` is only a
count for Ray's scheduler, not pinning (a task sees every core). So a CPU shard claims its cores itself:
one ``flock``'d file per core under a node-wide folder (``CoreClaim``), released by the kernel when the
process dies, and pins itself with ``os.sched_setaffinity`` before it starts its engine, which inherits
the mask. vLLM on CPU binds its threads within that mask (its "auto" binding reads the process's
affinity); forcing ``VLLM_CPU_OMP_THREADS_BIND`` to every claimed core instead put its compute threads on
the core "auto" leaves to the server and the client, and tripled the decode baseline on the smoke grid.
A node that cannot give a shard cores nobody else holds refuses the shard (``PlacementError``). Every
execution of a shard is recorded in the manifest (``ShardRun``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from benchcore.provenance import code_identity
from engine_harness.process_group import core_text
from microbench.results.layout import JobFolder
from microbench.results.records import ShardRun

__all__ = [
    "CORE_LOCKS",
    "CoreClaim",
    "PlacementError",
    "close_shard",
    "cluster_capacity",
    "device_text",
    "host_name",
    "record_shard",
    "running_code",
    "utc_now",
    "visible_gpus",
]

CORE_LOCKS = Path("/tmp/microbench-cores")  # node-wide: every shard on this node, whichever run it is
REPO = Path(__file__).resolve().parents[2]  # this process's checkout (a Ray node's own, on a worker)


class PlacementError(RuntimeError):
    """A shard cannot be isolated on its node (no free cores, no GPU of its own): refused, not measured."""


def running_code() -> str:
    """The code this process runs (``benchcore.provenance.code_identity`` of its checkout)."""
    return code_identity(REPO)


def host_name() -> str:
    return socket.gethostname()


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def visible_gpus(env: dict[str, str] | None = None) -> list[str]:
    """The GPU ids a process may use (``CUDA_VISIBLE_DEVICES``; empty: none set, or none)."""
    value = (env if env is not None else os.environ).get("CUDA_VISIBLE_DEVICES", "")
    return [g for g in (part.strip() for part in value.split(",")) if g and g != "-1"]


def cluster_capacity(nodes: list[dict[str, Any]], shard_cores: int | None) -> int:
    """Shards that can run at once, each alone: one per GPU of the alive nodes (``ray.nodes()`` shape);
    on CPU-only nodes, ``shard_cores`` cores each, never across nodes. At least 1 (one at a time)."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    gpus = int(sum(r.get("GPU", 0) for r in alive))
    if gpus:
        return gpus
    return max(sum(int(r.get("CPU", 0)) // max(shard_cores or 1, 1) for r in alive), 1)


def device_text(hardware: str, gpus: list[str], cores: list[int]) -> str:
    """What a shard measured on, in words: ``GPU 3 (NVIDIA H100)`` or ``CPU cores 0-1 (CPU: AMD …)``."""
    if gpus:
        return f"GPU {','.join(gpus)} ({hardware})"
    return f"CPU cores {core_text(cores)} ({hardware})"


class CoreClaim:
    """``n`` cores of this process's affinity that no other shard on the node holds, held until ``release``.

    Each core is a file ``<folder>/core-<n>.lock`` under an exclusive, non-blocking ``flock``: two shards on
    one node (of one run or of two) never hold the same core, and a shard that dies releases its cores.
    """

    def __init__(self, n: int, folder: Path = CORE_LOCKS) -> None:
        self.n = n
        self.folder = folder
        self.cores: list[int] = []
        self._files: list[IO[bytes]] = []

    def acquire(self) -> list[int]:
        mine = sorted(os.sched_getaffinity(0))
        if self.n > len(mine):
            raise PlacementError(
                f"a shard needs {self.n} cores of its own, but this process may run on {len(mine)} "
                f"({core_text(mine)}) on {host_name()}; ask for fewer with --shard-cpus"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        held = []
        for core in mine:
            if len(self.cores) == self.n:
                break
            f = (self.folder / f"core-{core}.lock").open("a+b")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                held.append(core)
                continue
            self._files.append(f)
            self.cores.append(core)
        if len(self.cores) < self.n:
            self.release()
            raise PlacementError(
                f"{host_name()} cannot isolate a shard: it needs {self.n} free cores, but cores "
                f"{core_text(held)} of {core_text(mine)} are held by other shards (locks under "
                f"{self.folder}); shards on shared cores would measure each other, so this one is refused"
            )
        return list(self.cores)

    def release(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        self._files.clear()
        self.cores = []

    def __enter__(self) -> list[int]:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def record_shard(folder: JobFolder, run: ShardRun) -> None:
    """Store ``run`` in the manifest's ``shards``, replacing its earlier state (same shard, start, pid)."""
    manifest = folder.read_manifest()

    def key(s: ShardRun) -> tuple[object, ...]:
        return s.chunk, s.part, s.started_utc, s.pid, s.host

    manifest.shards = [s for s in manifest.shards if key(s) != key(run)] + [run]
    folder.write_manifest(manifest)


def close_shard(
    folder: JobFolder, run: ShardRun, t0: float, points: int, outcome: str, engine_version: str | None
) -> None:
    """Store how ``run`` ended (wall time since ``t0``, points made final, outcome); best effort: a disk
    too full for the manifest must not hide the shard's own error, and every point is stored already."""
    run.wall_s = round(time.perf_counter() - t0, 3)
    run.points = points
    run.outcome = outcome
    run.engine_version = engine_version
    with contextlib.suppress(OSError):
        record_shard(folder, run)
