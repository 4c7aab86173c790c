"""The body of a remote shard, as a generator of relay messages (``relay``); Ray-free, so it is testable.

``stream_task`` claims the shard's place on its node (its own cores on a CPU-only node, pinned; a GPU
shard has the GPU Ray gave it) and checks that the node runs the driver's code (a node with another
checkout or version would measure with other code under the driver's run: the shard ends as failed,
naming both, before its engine starts), then runs the shard's ``TaskBody`` on an event loop in a thread
of its own over a scratch folder, and yields every message the body emits as it is emitted (an
interference shard's, ``stream_shard``: a ``RelaySink`` over a scratch run folder and the shard's
events): the driver writes each stored point before the next is measured. When the consumer stops (Ray
cancelled the task, the driver went away), the shard's loop is cancelled, which stops its engine. The
scratch folder is deleted at the end; nothing of the worker's own files (e.g. Ray's token under the home
folder) is ever sent. ``interference_job`` is an interference shard as either executor runs it.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import os
import queue
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiohttp
import psutil
from rich.console import Console

from microbench.client import aio
from microbench.client.aio import LagMonitor
from microbench.client.session import engine_session
from microbench.executors.job import ShardJob
from microbench.executors.placement import (
    CORE_LOCKS,
    CoreClaim,
    PlacementError,
    host_name,
    running_code,
    visible_gpus,
)
from microbench.executors.relay import Finished, Relay, RelayEvents, RelaySink, Started, seed_files
from microbench.measure.plan import ShardPlan
from microbench.measure.shard import ShardContext, measure_shard
from microbench.measure.sink import FolderSink
from microbench.measure.timing import Timing
from microbench.results.layout import RunFolder

__all__ = [
    "Emit",
    "InterferenceShards",
    "TaskBody",
    "TaskOptions",
    "interference_job",
    "stream_shard",
    "stream_task",
]

Emit = Callable[[object], None]

_END = object()
SCRATCH_PREFIX = "microbench-shard-"  # + <worker pid>-<chunk>-<random>, in the node's temporary folder


@dataclass(frozen=True)
class TaskOptions:
    """How a remote shard places itself: ``cores`` to own on a CPU-only node (None: a GPU shard); the
    driver's code (``placement.running_code``), which the shard's must equal (None: not checked)."""

    cores: int | None = None
    driver_code: str | None = None
    core_locks: Path = CORE_LOCKS
    start_timeout_s: float | None = None
    node_id: str | None = None  # the Ray node, and its hardware as records name it (``RunConfig.gpu``)
    hardware: str | None = None


class TaskBody(Protocol):
    """What a placed shard does on its worker: ``measure`` (emitting its messages as it goes), then the
    files it sends once its engine has stopped (its log, telemetry)."""

    async def measure(self, timing: Timing) -> None: ...

    def end_files(self) -> list[tuple[str, bytes]]: ...


class _Loop:
    """The shard's event loop in a thread; ``stop`` cancels it from the generator's thread."""

    def __init__(self, name: str, body: TaskBody, out: queue.Queue[object]):
        self.body, self.out = body, out
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None
        self.timing = Timing()
        self.thread = threading.Thread(target=self._main, name=f"shard-{name}", daemon=True)

    def _main(self) -> None:
        error = None
        try:
            aio.run(self._measure())
        except BaseException as exc:  # reported to the driver as the shard's outcome
            error = (
                f"{type(exc).__name__}: {exc}" if not isinstance(exc, asyncio.CancelledError) else "stopped"
            )
        self.out.put(Finished(self.body.end_files(), dict(self.timing.spent), error))
        self.out.put(_END)

    async def _measure(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        await self.body.measure(self.timing)

    def stop(self) -> None:
        if self.loop is not None and self.task is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(timeout=60)


def _remove_orphans() -> None:
    """Delete scratch folders of shards whose worker died without cleaning up (killed: SIGKILL, OOM)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*-*"):
        pid = folder.name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def stream_task(
    name: str, hardware: str, options: TaskOptions, body: Callable[[Path, Emit], TaskBody]
) -> Iterator[object]:
    """Place the shard ``name`` here and run ``body(scratch folder, emit)``, yielding its messages:
    ``Started``, the body's, ``Finished`` (at once, with the reason, when this node runs other code)."""
    claim = CoreClaim(options.cores, options.core_locks) if options.cores else None
    _remove_orphans()
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-{name}-"))
    try:
        cores = claim.acquire() if claim is not None else sorted(os.sched_getaffinity(0))
        if claim is not None:
            # the engine started below inherits the mask; vLLM's own thread binding ("auto") places its
            # threads within it (it reads sched_getaffinity), as it does for a local run on the whole box
            os.sched_setaffinity(0, cores)
        gpus = visible_gpus()
        if claim is None and not gpus:
            raise PlacementError(
                f"a GPU shard on {host_name()} was given no GPU (CUDA_VISIBLE_DEVICES is empty)"
            )
        code = running_code()
        yield Started(host_name(), os.getpid(), options.node_id, gpus, cores, hardware, code)
        if options.driver_code is not None and code != options.driver_code:
            yield Finished(
                [],
                error=f"{host_name()} runs other code than the driver ({code}; the driver: "
                f"{options.driver_code}): check out the driver's commit there (or install its version) "
                "and --resume",
            )
            return
        out: queue.Queue[object] = queue.Queue()
        runner = _Loop(name, body(scratch, out.put), out)
        runner.thread.start()
        try:
            while (message := out.get()) is not _END:
                yield message
        finally:
            runner.stop()
    finally:
        if claim is not None:
            claim.release()
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class _InterferenceBody:
    plan: ShardPlan
    sink: RelaySink
    emit: Emit
    options: TaskOptions

    async def measure(self, timing: Timing) -> None:
        console = Console(file=sys.stdout, width=160, force_terminal=False, soft_wrap=True)
        lag = LagMonitor()
        lag.start()
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
            async with engine_session(timeout=timeout) as session:
                context = ShardContext(
                    session, console, timing, RelayEvents(self.emit), lag,
                    start_timeout_s=self.options.start_timeout_s,
                )  # fmt: skip
                await measure_shard(self.plan, self.sink, context)
        finally:
            await lag.stop()

    def end_files(self) -> list[tuple[str, bytes]]:
        return self.sink.end_files()


def stream_shard(
    plan: ShardPlan, run_id: str, seed: list[tuple[str, bytes]], options: TaskOptions
) -> Iterator[object]:
    """Measure ``plan`` of run ``run_id`` here, yielding relay messages: ``Started``, the shard's, the end."""

    here = dataclasses.replace(plan, hardware=options.hardware or plan.hardware)  # the node's hardware

    def body(scratch: Path, emit: Emit) -> TaskBody:
        sink = RelaySink(RunFolder(scratch / run_id), emit, seed)  # records name the run, not the scratch
        return _InterferenceBody(here, sink, emit, options)

    return stream_task(here.name, here.hardware, options, body)


def interference_job(plan: ShardPlan, sink: FolderSink, context: ShardContext) -> ShardJob:
    """An interference shard (``plan``, into ``sink``'s run folder) for either executor."""

    def done() -> int:
        return sum(1 for d, p, r in plan.points() if sink.is_done(plan.chunk, d, p, r))

    return ShardJob(
        name=plan.name,
        chunk=plan.chunk,
        part=plan.part,
        spec=plan.spec,
        hardware=plan.hardware,
        folder=sink.folder,
        local=lambda: measure_shard(plan, sink, context),
        task=stream_shard,
        args=lambda: (plan, sink.run_id, seed_files(sink.folder, plan.chunk)),
        relay=lambda: Relay(sink, context.events),
        done=done,
        total=len(plan.points()),
        engine_version=lambda: sink.folder.read_manifest().engine_version,
    )


class InterferenceShards(abc.ABC):
    """``run`` and ``run_jobs`` of every executor: a sweep's or an ablation's shards as ``interference_job``s
    for the executor's own ``run_tasks``."""

    async def run(self, plans: Sequence[ShardPlan], sink: FolderSink, context: ShardContext) -> None:
        await self.run_jobs([(plan, sink) for plan in plans], context)

    async def run_jobs(self, jobs: Sequence[tuple[ShardPlan, FolderSink]], context: ShardContext) -> None:
        shards = [interference_job(plan, sink, context) for plan, sink in jobs]
        await self.run_tasks(shards, context.console, context.timing)

    @abc.abstractmethod
    async def run_tasks(self, jobs: Sequence[ShardJob], console: Console, timing: Timing) -> None: ...
