"""Runs a ``SweepConfig`` into a ``RunFolder``: one interference shard per chunk size, run by an executor.

The runner owns the shards, the progress display and its ETA, and the account of the wall time; the
executor (``microbench.executors``: local in turn, or Ray) runs them; the measurement is
``microbench.measure.shard`` (engine, decode batches, injections, faults), which
stores every attempt through a ``FolderSink`` the moment it is final, so a crash, Ctrl-C or a full disk
loses at most the point in flight.
"""

from __future__ import annotations

import functools

import aiohttp
from rich.progress import Progress, TaskID

from benchcore.console import console
from microbench.client.aio import LagMonitor
from microbench.client.session import engine_session
from microbench.executors import Executor
from microbench.executors.local import LocalExecutor
from microbench.measure.grid import SweepConfig, hardware_name, shard_plans
from microbench.measure.plan import ShardPlan, split_plans
from microbench.measure.shard import ShardContext, ShardEvents
from microbench.measure.sink import FolderSink, Stored
from microbench.measure.timing import Timing
from microbench.results.layout import RunFolder
from microbench.sweep.eta import PointClock
from microbench.sweep.progress import eta_text, progress_bar
from microbench.sweep.summary import print_summary

__all__ = ["SweepRunner"]


class _Display(ShardEvents):
    """The shards' events on the progress line: what runs, the last penalty ratio, invalid attempts, ETA."""

    def __init__(self, progress: Progress, task: TaskID, clock: PointClock) -> None:
        self.progress = progress
        self.task = task
        self.clock = clock
        self.invalid_attempts = 0
        self.last_ratio: float | None = None

    def describe(self, text: str) -> None:
        ratio = f"{self.last_ratio:.2f}×" if self.last_ratio is not None else "–"
        self.progress.update(
            self.task, description=f"{text} · last penalty ratio {ratio} · invalid {self.invalid_attempts}"
        )

    def measuring(self, chunk: int) -> None:
        self.clock.measuring(chunk)

    def stored(self, stored: Stored) -> None:
        record = stored.record
        if record.validity.valid:
            self.last_ratio = record.derived.penalty_ratio
        else:
            self.invalid_attempts += 1
        if stored.taken_back:  # counted done when it was stored; judged against its cell since
            self.progress.advance(self.task, -1)
        if stored.done:
            c = record.config
            self.clock.finished(c.chunk_size, c.decode_batch_size, c.new_prefill_tokens)
            self.progress.update(self.task, eta=eta_text(self.clock.eta_s()))
            self.progress.advance(self.task)


class SweepRunner:
    def __init__(
        self,
        folder: RunFolder,
        sweep: SweepConfig,
        start_timeout_s: float | None = None,
        executor: Executor | None = None,
        shards: int | None = None,
    ) -> None:
        self.folder = folder
        self.executor: Executor = executor or LocalExecutor()
        self.shards = shards  # None: as many as the executor runs at once
        self.sweep = sweep
        self.sink = FolderSink(folder)
        self.console = console()
        self.timing = Timing()
        self.start_timeout_s = start_timeout_s
        self.invalid_attempts = 0

    @functools.cached_property
    def plans(self) -> list[ShardPlan]:
        """One shard per chunk size, resolved once for the run (engine spec, hardware, decode budgets)."""
        return shard_plans(self.sweep, hardware_name(self.folder.read_manifest().hardware))

    def _grid(self) -> list[tuple[int, int, int, int]]:
        return [(plan.chunk, *point) for plan in self.plans for point in plan.points()]

    async def run(self) -> None:
        todo = [point for point in self._grid() if not self.sink.is_done(*point)]
        total = self.sweep.points()
        if done := total - len(todo):
            self.console.print(f"resuming {self.folder.root.name}: {done}/{total} points already measured")
        clock = PointClock((c, d, p) for c, d, p, _ in todo)
        lag = LagMonitor()
        with progress_bar(self.console) as progress:
            task = progress.add_task("starting", total=total, completed=done, eta=eta_text(None))
            display = _Display(progress, task, clock)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
            lag.start()
            try:
                async with engine_session(timeout=timeout) as session:
                    context = ShardContext(
                        session, self.console, self.timing, display, lag, start_timeout_s=self.start_timeout_s
                    )
                    with self.executor.session(self.timing):
                        plans = split_plans(self.plans, self.shards or self.executor.capacity())
                        if len(plans) > len(self.plans):
                            self.console.print(
                                f"{len(plans)} shards, each chunk size's D values in groups: "
                                f"{', '.join(plan.name for plan in plans)}",
                                soft_wrap=True,
                            )
                        await self.executor.run(plans, self.sink, context)
            finally:
                self.invalid_attempts = display.invalid_attempts
                await lag.stop()

    def invalid_points(self) -> int:
        """Points of this run recorded as finally invalid (their attempts spent)."""
        records = (self.folder.stored_record(*point) for point in self._grid())
        return sum(1 for record in records if record is not None and not record.validity.valid)

    def finish(self) -> None:
        """Write the table and print the summary from whatever is on disk."""
        self.console.print(self.executor.account(self.timing))
        if self.invalid_attempts:
            self.console.print(
                f"{self.invalid_attempts} invalid attempt(s) kept under "
                f"{self.folder.root / 'invalid'} with their reasons"
            )
        print_summary(self.folder.root, self.console)
