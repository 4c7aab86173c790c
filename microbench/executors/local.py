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

from rich.console import Console

from microbench.executors.job import ShardJob
from microbench.executors.placement import (
    close_shard,
    device_text,
    host_name,
    record_shard,
    running_code,
    utc_now,
    visible_gpus,
)
from microbench.executors.shard_task import InterferenceShards
from microbench.measure.timing import Timing
from microbench.results.records import ShardRun

__all__ = ["LocalExecutor"]


class LocalExecutor(InterferenceShards):
    name = "local"

    def account(self, timing: Timing) -> str:
        return timing.report()  # one shard at a time: the run's phases are the shards' phases

    def session(self, timing: Timing) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capacity(self) -> int:
        return 1  # this machine, one shard at a time

    async def run_tasks(self, jobs: Sequence[ShardJob], console: Console, timing: Timing) -> None:
        """Each shard in turn, in this process, in the order given; finished ones are skipped."""
        code = running_code()
        for job in jobs:
            before = job.done()
            if before == job.total:
                continue
            gpus = visible_gpus(job.spec.env) or visible_gpus()
            cores = sorted(os.sched_getaffinity(0))
            run = ShardRun(
                chunk=job.chunk,
                part=job.part,
                executor="local",
                host=host_name(),
                pid=os.getpid(),
                device=device_text(job.hardware, gpus, cores),
                gpus=gpus,
                cores=cores,
                cores_exclusive=True,  # one shard at a time
                code=code,
                driver_code=code,  # this process is the driver
                started_utc=utc_now(),
            )
            record_shard(job.folder, run)
            t0 = time.perf_counter()
            outcome = "done"
            try:
                await job.local()
            except (KeyboardInterrupt, asyncio.CancelledError):
                outcome = "stopped"
                raise
            except Exception as exc:
                outcome = f"failed: {exc}"
                raise
            finally:
                close_shard(job.folder, run, t0, job.done() - before, outcome, job.engine_version())
