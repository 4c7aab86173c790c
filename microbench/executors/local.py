"""The ``local`` executor: every shard in turn, in this process, on this machine (the default).

One shard at a time owns the machine's GPUs or cores, so shards never share them; each execution is
recorded in the manifest (``ShardRun``: host, device, engine version, wall time, outcome).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence

from microbench.executors.placement import (
    close_shard,
    device_text,
    host_name,
    record_shard,
    running_code,
    utc_now,
    visible_gpus,
)
from microbench.measure.plan import ShardPlan
from microbench.measure.shard import ShardContext, measure_shard
from microbench.measure.sink import FolderSink
from microbench.measure.timing import Timing
from microbench.results.records import ShardRun

__all__ = ["LocalExecutor", "points_done"]


def points_done(plan: ShardPlan, sink: FolderSink) -> int:
    """Points of ``plan`` that ``sink`` holds as final."""
    return sum(1 for d, p, r in plan.points() if sink.is_done(plan.chunk, d, p, r))


class LocalExecutor:
    name = "local"

    def account(self, timing: Timing) -> str:
        return timing.report()  # one shard at a time: the run's phases are the shards' phases

    def session(self, timing: Timing) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capacity(self) -> int:
        return 1  # this machine, one shard at a time

    async def run(self, plans: Sequence[ShardPlan], sink: FolderSink, context: ShardContext) -> None:
        await self.run_jobs([(plan, sink) for plan in plans], context)

    async def run_jobs(self, jobs: Sequence[tuple[ShardPlan, FolderSink]], context: ShardContext) -> None:
        """Each shard in turn, in the order given."""
        code = running_code()
        for plan, sink in jobs:
            before = points_done(plan, sink)
            if before == len(plan.points()):
                continue
            gpus = visible_gpus(plan.spec.env) or visible_gpus()
            cores = sorted(os.sched_getaffinity(0))
            run = ShardRun(
                chunk=plan.chunk,
                part=plan.part,
                executor="local",
                host=host_name(),
                pid=os.getpid(),
                device=device_text(plan.hardware, gpus, cores),
                gpus=gpus,
                cores=cores,
                cores_exclusive=True,  # one shard at a time
                code=code,
                driver_code=code,  # this process is the driver
                started_utc=utc_now(),
            )
            record_shard(sink.folder, run)
            t0 = time.perf_counter()
            outcome = "done"
            try:
                await measure_shard(plan, sink, context)
            except (KeyboardInterrupt, asyncio.CancelledError):
                outcome = "stopped"
                raise
            except Exception as exc:
                outcome = f"failed: {exc}"
                raise
            finally:
                version = sink.folder.read_manifest().engine_version
                close_shard(sink.folder, run, t0, points_done(plan, sink) - before, outcome, version)
