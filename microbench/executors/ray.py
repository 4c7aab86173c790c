"""The ``ray`` executor: each shard a Ray task on its own GPU (CPU-only: its own cores), streamed back.

Each shard with points left is one task (``num_returns="streaming"``: a generator task) asking for one
GPU where the cluster has GPUs (Ray sets its ``CUDA_VISIBLE_DEVICES``; two shards never share one), else
``--shard-cpus`` CPUs (default: a whole node), which the task claims and pins itself to
(``placement.CoreClaim``). The task starts its engine on its node and yields every file its shard stores
(``shard_task``); this process writes each into the run folder as it arrives (``relay.Relay``), so a
Ctrl-C, a dead node or a lost task loses at most the point in flight, and ``--resume`` re-submits only
the shards, and within them the points, that are missing. A lost shard does not stop the others; the run
ends with an error naming it. ``--ray-address`` joins a running cluster; without it a local Ray instance
starts for the run and stops after it, its session (logs, sockets) and token in a scratch folder removed
with it (Ray's default ``/tmp/ray`` keeps every session's folder: 120 of them, 25 MB, on a box that had run
the tests; its token goes to ``~/.ray/auth_token``). Ray is imported here only (the optional ``[ray]`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import ray
import ray.exceptions
from rich.console import Console

from benchcore.cli import BadInput
from benchcore.provenance import hardware_info
from engine_harness.engines import engine_kind
from engine_harness.telemetry import NvmlSource
from microbench.executors.job import JobRelay, ShardJob
from microbench.executors.placement import (
    close_shard,
    cluster_capacity,
    device_text,
    record_shard,
    running_code,
    utc_now,
)
from microbench.executors.relay import Finished, Started
from microbench.executors.shard_task import InterferenceShards, TaskOptions
from microbench.measure.engine_lifecycle import SweepAborted
from microbench.measure.grid import hardware_name
from microbench.measure.timing import Timing
from microbench.results.records import ShardRun

__all__ = ["RayExecutor", "cluster_shape"]


def _remote(
    task: Callable[..., Iterator[object]], args: tuple[Any, ...], options: TaskOptions
) -> Iterator[object]:
    """On the worker: the shard's messages, told the node it landed on and its hardware."""
    node = ray.get_runtime_context().get_node_id()
    hardware = hardware_name(hardware_info(NvmlSource.gpu_names()))  # this node's, as records name it
    yield from task(*args, dataclasses.replace(options, node_id=node, hardware=hardware))


def _drain(stream: Any, relay: JobRelay) -> None:
    """Write what the shard has already sent and this process has not read yet (a stop came between)."""
    next_ready = getattr(stream, "_next_sync", None)  # Ray's generator, without waiting for more
    while next_ready is not None:
        try:
            ref = next_ready(timeout_s=0)
            if ref.is_nil():
                return
            relay.apply(ray.get(ref, timeout=5))
        except (StopIteration, ray.exceptions.RayError, OSError, ValueError):
            return


def cluster_shape(nodes: list[dict[str, Any]]) -> tuple[float, int]:
    """(GPUs in the cluster, CPUs of its largest node) from ``ray.nodes()``, alive nodes only."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    return sum(r.get("GPU", 0) for r in alive), int(max((r.get("CPU", 0) for r in alive), default=0))


_TOKEN = secrets.token_hex(32)  # one per process: Ray's token loader keeps the first token it reads


def local_token(scratch: Path) -> list[str]:
    """A local instance's authentication token in its scratch folder; the variables set, to remove once the
    instance stops.

    Ray turns token authentication on for a local instance and, finding no token, writes one to
    ``~/.ray/auth_token`` (outside the output folder, kept for good). The token goes into ``scratch``
    (mode 0600, removed with it) and ``RAY_AUTH_TOKEN_PATH`` names it, for this process and the instance's,
    which inherit it. A token the user gave (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``) stands, and
    so does the mode they chose (``RAY_AUTH_MODE``).
    """
    if "RAY_AUTH_TOKEN" in os.environ or "RAY_AUTH_TOKEN_PATH" in os.environ:
        return []
    path = scratch / "auth_token"
    path.touch(mode=0o600)
    path.write_text(_TOKEN)
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    return ["RAY_AUTH_TOKEN_PATH"]


@contextlib.contextmanager
def local_instance() -> Iterator[None]:
    """A local Ray instance on the cores this process may use, its session (logs, sockets) and token in a
    scratch folder, all removed when it stops, or at once when it fails to start."""
    scratch = Path(tempfile.mkdtemp(prefix="microbench-ray-"))  # short: Ray's sockets live there
    token_vars = local_token(scratch)
    try:
        ray.init(
            num_cpus=len(os.sched_getaffinity(0)),  # the cores this process may use, not the machine's
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
            _temp_dir=str(scratch),
        )
        try:
            yield
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for name in token_vars:
            os.environ.pop(name, None)


class RayExecutor(InterferenceShards):
    name = "ray"

    def __init__(self, address: str | None = None, shard_cpus: int | None = None, **options: Any) -> None:
        self.address = address
        self.shard_cpus = shard_cpus
        self.options = {"driver_code": running_code()} | options  # TaskOptions fields
        self.shards = 0  # submitted in this process
        self._open = False  # inside ``session``

    def _connect(self) -> contextlib.ExitStack | None:
        """Join ``address`` or start a local instance; what stops the one this process started (None: it
        joined one)."""
        if ray.is_initialized():
            return None
        if self.address:
            ray.init(
                address=self.address, include_dashboard=False, log_to_driver=True, configure_logging=False
            )
            return None
        local = contextlib.ExitStack()
        local.enter_context(local_instance())
        return local

    def account(self, timing: Timing) -> str:
        """The run's wall time around its shards; each shard's own account was printed as it ended (shards
        overlap in time, so their phases do not add up to the run's)."""
        wall = time.perf_counter() - timing.t0
        start, shards, stop = (timing.spent.get(k, 0.0) for k in ("Ray start", "shards", "Ray stop"))
        other = max(wall - start - shards - stop, 0.0)
        return (
            f"wall {wall:.1f} s = Ray start {start:.1f} s + {self.shards} shard(s) on Ray {shards:.1f} s "
            f"(each one's account above) + Ray stop {stop:.1f} s + other {other:.1f} s"
        )

    def _resources(self) -> tuple[dict[str, Any], TaskOptions]:
        """What each shard's task asks Ray for, and how it places itself: refused when it cannot be alone."""
        gpus, node_cpus = cluster_shape(ray.nodes())
        if gpus >= 1:
            return {"num_gpus": 1, "num_cpus": 1}, TaskOptions(**self.options)
        cores = self.shard_cpus or node_cpus
        if cores > node_cpus or cores < 1:
            raise BadInput(
                f"--shard-cpus {cores}: no node of the Ray cluster has that many CPUs (the largest has "
                f"{node_cpus}); a shard must own its cores, so ask for at most {node_cpus} and --resume"
            )
        return {"num_cpus": cores}, TaskOptions(cores=cores, **self.options)

    @contextlib.contextmanager
    def session(self, timing: Timing) -> Iterator[None]:
        """Ray joined (or a local instance started) for every ``run`` inside, left (stopped) at the end."""
        if self._open:
            yield
            return
        with timing.phase("Ray start"):
            local = self._connect()
        self._open = True
        try:
            yield
        finally:
            self._open = False
            if local is not None:
                with timing.phase("Ray stop"):
                    local.close()

    def capacity(self) -> int:
        """Shards that can run at once, each on a GPU of its own (CPU-only: cores of its own), now."""
        _, options = self._resources()
        return cluster_capacity(ray.nodes(), options.cores)

    async def run_tasks(self, jobs: Sequence[ShardJob], console: Console, timing: Timing) -> None:
        """Every shard with something left a Ray task at once; a lost one does not stop the others, and the
        end names every one that did not finish (``SweepAborted``)."""
        todo = [job for job in jobs if job.done() < job.total]
        if not todo:
            return
        if shared := sorted({j.spec.kind for j in todo if not engine_kind(j.spec.kind).launched}):
            raise BadInput(
                f"--executor ray starts an engine per shard; a {', '.join(shared)} engine is one engine that "
                "every shard would share (they would measure each other): use --executor local"
            )
        named = len({job.folder.root for job in todo}) > 1  # several run folders (an ablation's arms)
        with self.session(timing):
            resources, options = self._resources()
            remote = ray.remote(_remote).options(num_returns="streaming", max_retries=0, **resources)
            self.shards += len(todo)
            with timing.phase("shards"):
                lost = await asyncio.gather(
                    *(self._shard(remote, job, options, console, named) for job in todo)
                )
        if failed := [why for why in lost if why]:
            raise SweepAborted(
                f"{len(failed)} of {len(todo)} shard(s) did not finish: {'; '.join(failed)}; every point "
                "they stored is kept, and --resume measures only the missing ones"
            )

    async def _shard(
        self, remote: Any, job: ShardJob, options: TaskOptions, console: Console, named: bool
    ) -> str | None:
        """Run one shard to its end; what went wrong with it (None: it finished)."""
        label = f"{job.folder.root.name} shard {job.name}" if named else f"shard {job.name}"
        relay = job.relay()
        before = job.done()
        stream = remote.remote(job.task, job.args(), options)
        run: ShardRun | None = None
        t0 = time.perf_counter()
        outcome, why = "done", None
        try:
            async for ref in stream:
                message = await ref
                if isinstance(message, Started):
                    run = self._started(job, message, options)
                    t0 = time.perf_counter()
                relay.apply(message)
                if isinstance(message, Finished):
                    # shards overlap in time: each one's account is its own, not summed into the run's
                    spent = Timing(t0=t0, spent=message.spent)
                    console.print(f"{label}: {spent.report()}", soft_wrap=True)
                    if message.error:
                        outcome, why = f"failed: {message.error}", f"{label}: {message.error}"
        except (KeyboardInterrupt, asyncio.CancelledError):
            outcome = "stopped"
            _drain(stream, relay)  # before the cancel, which turns what is still unread into errors
            ray.cancel(stream)
            raise
        except ray.exceptions.RayError as exc:  # the task, its worker or its node was lost
            text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            outcome, why = f"failed: {type(exc).__name__}: {text}", f"{label}: {text}"
            console.print(f"[red]{label}: its Ray task ended: {text}", soft_wrap=True)
        finally:
            if run is not None:
                close_shard(job.folder, run, t0, job.done() - before, outcome, relay.engine_version)
        return why

    @staticmethod
    def _started(job: ShardJob, message: Started, options: TaskOptions) -> ShardRun:
        run = ShardRun(
            chunk=job.chunk,
            part=job.part,
            executor="ray",
            host=message.host,
            node_id=message.node_id,
            pid=message.pid,
            device=device_text(message.hardware, message.gpus, message.cores),
            gpus=message.gpus,
            cores=message.cores,
            cores_exclusive=bool(message.gpus) or options.cores is not None,
            code=message.code,
            driver_code=options.driver_code,
            started_utc=utc_now(),
        )
        record_shard(job.folder, run)
        return run
