"""Runs an ``AblateConfig`` into an ``AblateFolder``: counterbalanced rounds of one shard per arm × chunk.

Round r measures repetition r of every point of the grid under each arm, one engine start per arm and
chunk size (``microbench.measure.shard``), the arms' order reversed every other round (A B, B A, A B …),
so slow drift of the machine falls on both arms alike. Each arm's points go to its own sweep run folder
(``arms/<name>/``, through a ``FolderSink``), which ``analysis.compare`` reads like any run; the shard
skips what a folder holds, so an interrupted ablation resumes where it stopped. With ``until_resolved``
rounds are added until every cell of every comparison is decided, or the round/time budget is spent.

The shards go to an executor (``microbench.executors``). Counterbalancing in time needs one device: with
``local`` (the default), or a cluster that cannot hold a round's arms at once, they run in turn in that
order. Where the executor can place every arm of a chunk size on a device of its own at once (Ray: a GPU
each, or cores of their own), the arms run side by side, and drift cancels by simultaneity, not by order
(``round_groups``); each shard's placement is in its arm's manifest (``shards``), the mode in the notes.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import TYPE_CHECKING

import aiohttp

from benchcore.console import console
from engine_harness.launch import EngineError
from microbench.ablate.config import AblateConfig
from microbench.client.aio import LagMonitor
from microbench.client.session import engine_session
from microbench.executors import Executor, Job
from microbench.executors.local import LocalExecutor
from microbench.measure.grid import hardware_name, shard_plans
from microbench.measure.plan import ShardPlan
from microbench.measure.shard import ShardContext
from microbench.measure.sink import FolderSink
from microbench.measure.timing import Timing
from microbench.results.layout import AblateFolder

if TYPE_CHECKING:
    from analysis.compare import Comparison

__all__ = ["AblateRunner", "ArmFailed", "NotComparable", "arm_order", "round_groups"]


class ArmFailed(RuntimeError):
    """An arm's engine could not be started or kept running; the message names the arm."""


class NotComparable(RuntimeError):
    """The arms' runs hold nothing to compare (e.g. every point of an arm invalid); the message says why."""


def arm_order(names: list[str], round_index: int) -> list[str]:
    """The arms' order in a round: as given in even rounds, reversed in odd ones (A B, B A, …)."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def round_groups(order: list[str], chunks: int, capacity: int) -> list[list[tuple[str, int]]]:
    """A round's shards (arm, chunk index) as groups run one after another, each group's shards at once.

    Every shard at once where ``capacity`` (shards the executor can run at once, each alone on a device)
    holds them all; else the arms of one chunk size at once where it holds those; else one at a time, in
    ``order`` (the counterbalanced order), which is the only case where order matters.
    """
    shards = [(name, index) for index in range(chunks) for name in order]
    if capacity >= len(shards):
        return [shards]
    if capacity >= len(order):
        return [[(name, index) for name in order] for index in range(chunks)]
    return [[shard] for shard in shards]


class AblateRunner:
    def __init__(
        self,
        folder: AblateFolder,
        config: AblateConfig,
        start_timeout_s: float | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.folder = folder
        self.executor: Executor = executor or LocalExecutor()
        self.capacity = 1
        self.config = config
        self.sinks = {name: FolderSink(folder.arm(name)) for name in config.names}
        self.console = console()
        self.timing = Timing()
        self.start_timeout_s = start_timeout_s
        self.rounds_done = 0
        self.stop_reason = ""

    @functools.cached_property
    def plans(self) -> dict[str, list[ShardPlan]]:
        """Per arm, one shard per chunk size: the same grid, seeds and prompt lengths, the arm's engine."""
        hardware = hardware_name(self.folder.read_manifest().hardware)
        return {
            name: shard_plans(self.config.arm_grid(name), hardware, functools.partial(self.config.spec, name))
            for name in self.config.names
        }

    async def run(self) -> None:
        lag = LagMonitor()
        lag.start()
        started = time.monotonic()
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
            async with engine_session(timeout=timeout) as session:
                context = ShardContext(
                    session, self.console, self.timing, lag=lag, start_timeout_s=self.start_timeout_s
                )
                with self.executor.session(self.timing):
                    self._placement()
                    for r in range(self.config.round_budget()):
                        await self._round(r, context)
                        self.rounds_done = r + 1
                        if self._finished(time.monotonic() - started):
                            break
        finally:
            await lag.stop()

    def _placement(self) -> None:
        """How the rounds place the arms (in turn, or side by side), printed and noted in the run folder."""
        self.capacity = self.executor.capacity()
        arms = len(self.config.names)
        if self.capacity >= arms:
            note = (
                f"{self.executor.name}: the {arms} arms of a round run side by side, each on its own device "
                f"({self.capacity} at once): drift cancels by simultaneity, not by order; the devices"
                "' differences do not cancel (each shard's device is in its arm's manifest)"
            )
        else:
            note = (
                f"{self.executor.name}: the arms of a round run in turn, their order reversed every other "
                "round: drift cancels by order"
            )
        self.console.print(note)
        self.folder.add_note(note)

    async def _round(self, r: int, context: ShardContext) -> None:
        order = arm_order(self.config.names, r)
        self.console.print(f"round {r + 1}: {' '.join(order)}")
        for group in round_groups(order, len(self.config.grid.chunks), self.capacity):
            jobs: list[Job] = []
            for name, index in group:
                plan = dataclasses.replace(self.plans[name][index], repetitions=r + 1)
                jobs.append((self._learned(name, plan), self.sinks[name]))
            try:
                await self.executor.run_jobs(jobs, context)
            except EngineError as exc:
                shards = ", ".join(
                    f"arm {name} (chunk {plan.chunk})"
                    for (name, _), (plan, _) in zip(group, jobs, strict=True)
                )
                raise ArmFailed(f"{shards}: {exc}") from exc

    def _learned(self, name: str, plan: ShardPlan) -> ShardPlan:
        """``plan`` with each D's decode budget raised to the largest one that measured a valid point of
        this arm in an earlier round: a round starts its own engine, and a batch that ran dry there (and
        got twice the tokens, ``measure.shard``) costs its steady-state wait again (SGLang on a loaded
        host: minutes) unless the next round starts where the last one ended."""
        folder, budgets = self.folder.arm(name), dict(plan.decode_budgets)
        for d in budgets:
            for r in range(plan.repetitions):
                for p in plan.prefill_tokens:
                    record = folder.stored_record(plan.chunk, d, p, r)
                    if record is not None and record.validity.valid:
                        budgets[d] = max(budgets[d], record.config.decode_max_tokens)
        return dataclasses.replace(plan, decode_budgets=budgets)

    def _finished(self, elapsed_s: float) -> bool:
        """Whether to stop after this round, with the reason in ``stop_reason``."""
        cfg, done = self.config, self.rounds_done
        if done < cfg.rounds:
            return False
        if cfg.until_resolved is None:
            self.stop_reason = f"{done} rounds as asked"
            return True
        try:
            undecided = sum(len(c.undecided()) for c in self.comparisons())
        except NotComparable as exc:  # e.g. an arm without a valid point yet: more rounds may bring one
            self.console.print(f"[yellow]{exc}")
            undecided = len(self.config.grid.decode_batch_sizes) * len(self.config.grid.prefill_tokens)
        if not undecided:
            self.stop_reason = f"every cell decided after {done} rounds (±{cfg.until_resolved:.0%})"
        elif cfg.max_minutes is not None and elapsed_s >= 60 * cfg.max_minutes:
            self.stop_reason = f"time budget of {cfg.max_minutes} min spent: {undecided} cell(s) undecided"
        elif done >= cfg.max_rounds:
            self.stop_reason = f"round budget of {cfg.max_rounds} spent: {undecided} cell(s) undecided"
        else:
            self.console.print(f"{undecided} cell(s) undecided after {done} rounds: another round")
            return False
        return True

    def comparisons(self) -> list[Comparison]:
        """Each arm after the first against the first (A), from what the arm folders hold now."""
        # imported here: the comparisons' pages pull in seaborn and scipy (≈ 2 s), which an ablation needs
        # only after its rounds, and --help or a refused flag not at all
        from analysis.compare import compare_runs

        cfg = self.config
        a, *others = cfg.names
        out = []
        for b in others:
            try:
                out.append(
                    compare_runs(
                        self.folder.arm(a).root,
                        self.folder.arm(b).root,
                        names=(a, b),
                        alpha=cfg.alpha,
                        tolerance=cfg.decision_tolerance(),
                        seed=cfg.grid.seed,
                    )
                )
            except ValueError as exc:
                raise NotComparable(f"{b} against {a}: {exc}") from exc
        return out

    def finish(self) -> list[Comparison]:
        """Write every comparison into the run folder and note how the rounds ended."""
        from analysis.compare import write_comparison

        self.console.print(self.executor.account(self.timing))
        if self.stop_reason:
            self.folder.add_note(f"stopped: {self.stop_reason}")
            self.console.print(f"stopped: {self.stop_reason}")
        out = []
        for c in self.comparisons():
            write_comparison(c, self.folder.comparison(c.name_a, c.name_b))
            out.append(c)
        return out
