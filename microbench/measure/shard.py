"""The interference shard: one chunk size of the grid, measured on its own engine, into a sink.

``measure_shard(plan, sink, context)`` starts the engine ``plan.spec`` (token budget ``plan.chunk``), warms
it up, primes the shared decode prefix and measures every (D, P, repetition) of the plan that the sink
does not hold yet: bare prefills for D = 0 (here) and injections into steady decode batches for D > 0
(``measure.batches``). Each attempt goes to the sink in one call; infrastructure faults (the engine died,
refused, answered 5xx) spend no attempt and are ridden out. Once a D's points are measured (and before
anything is, on ``--resume``), each of its cells is judged against its repetitions
(``microbench.results.validity.judged``): a point the others say the engine stalled in is measured
again. The sweep calls it per chunk size; an ablation or the Ray executor calls it the same way with its
own plan and sink.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field

import aiohttp
from rich.console import Console

from engine_harness.launch import EngineProcess
from engine_harness.step_model import num_prefill_steps
from microbench.client.aio import LagMonitor, no_full_collections
from microbench.measure.decode_batch import DecodeBatch, measure_baseline
from microbench.measure.engine_client import EngineClient, NotSteady, ProtocolError, wait_idle
from microbench.measure.engine_lifecycle import EngineLifecycle, SweepAborted
from microbench.measure.faults import FaultBudget, InfrastructureFault, batch_fault, infrastructure_error
from microbench.measure.interference import inject, raw_frame
from microbench.measure.plan import ShardPlan
from microbench.measure.sink import Attempt, PointSink, Stored
from microbench.measure.timing import Timing
from microbench.measure.wake import probe_wake
from microbench.results.faults import INFRASTRUCTURE
from microbench.results.records import RunRecord, point_name
from microbench.results.wake import WakeProbeConfig

__all__ = ["ShardContext", "ShardEvents", "measure_shard"]

Point = tuple[int, int, int]  # D, P, repetition


class ShardEvents:
    """What a shard tells its caller as it goes (a progress display); every hook may be left as is."""

    def describe(self, text: str) -> None:
        """What the shard is doing now."""

    def measuring(self, chunk: int) -> None:
        """The engine is warm and primed: points start (again, after a restart)."""

    def stored(self, stored: Stored) -> None:
        """An attempt was stored (``stored.done``: its point is final)."""


@dataclass
class ShardContext:
    """What the caller lends a shard: the HTTP session, console, clocks and the fault budget."""

    session: aiohttp.ClientSession
    console: Console
    timing: Timing = field(default_factory=Timing)
    events: ShardEvents = field(default_factory=ShardEvents)
    lag: LagMonitor | None = None
    faults: FaultBudget = field(default_factory=FaultBudget)
    start_timeout_s: float | None = None


async def measure_shard(plan: ShardPlan, sink: PointSink, context: ShardContext) -> None:
    """Measure every point of ``plan`` that ``sink`` does not hold yet (nothing starts when none is left)."""
    judge_cells(plan, sink, context, plan.decode_batch_sizes)
    if _wake_left(plan, sink) is None and all(sink.is_done(plan.chunk, d, p, r) for d, p, r in plan.points()):
        return
    await Shard(plan, sink, context).run()


def _wake_left(plan: ShardPlan, sink: PointSink) -> WakeProbeConfig | None:
    """The wake probe the plan asks for and the sink does not hold yet (None: none left)."""
    return plan.wake if plan.wake is not None and not sink.wake_done(plan.chunk) else None


def judge_cells(plan: ShardPlan, sink: PointSink, context: ShardContext, ds: list[int]) -> None:
    """Judge every cell of ``plan`` with a D in ``ds`` against its repetitions; report what was taken back."""
    for d in ds:
        for p in plan.prefill_tokens:
            for stored in sink.judge_cell(plan.chunk, d, p, plan.max_attempts):
                _report_invalid(context.console, stored)
                context.events.stored(stored)


def _report_invalid(console: Console, stored: Stored) -> None:
    record = stored.record
    if not record.validity.valid:
        console.print(
            f"[yellow]invalid: chunk {record.config.chunk_size} {_name(record)} "
            f"attempt {record.validity.attempt}: {'; '.join(record.validity.reasons)}"
            + (" (infrastructure: not counted)" if stored.blamed else "")
            + (" (measured again)" if stored.taken_back and not stored.final else "")
        )


class Shard:
    """The state of one running shard: its engine, the token space, the fault budget."""

    def __init__(self, plan: ShardPlan, sink: PointSink, context: ShardContext) -> None:
        self.plan = plan
        self.sink = sink
        self.ctx = context
        self.rules = plan.rules
        self.timing = context.timing
        self.engines = EngineLifecycle(sink, context.console, context.timing, context.start_timeout_s)
        self.space, self.prompts = plan.tokens()

    async def run(self) -> None:
        chunk = self.plan.chunk
        self.ctx.events.describe(f"chunk {chunk}: starting the engine")
        async with self.engines.running(self.plan.spec, chunk, self.plan.name) as engine:
            await self._run_engine(engine)

    async def _run_engine(self, engine: EngineProcess) -> None:
        """Warm up, prime the shared prefix, measure every point left; ride out infrastructure faults."""
        chunk = self.plan.chunk
        cold = True
        while True:
            client = self.engines.client(self.ctx.session, engine, self.ctx.lag)
            try:
                with self.timing.phase("warm-up"):
                    if cold:
                        self.ctx.events.describe(f"chunk {chunk}: warming up")
                        await self.engines.warm(client, self.space, chunk)
                        cold = False
                    # Prime the decode prompts once so every decode stream starts as a cache hit.
                    for prompt in self.prompts:
                        await self.engines.prime(client, prompt)
                self.ctx.events.measuring(chunk)
                with no_full_collections():
                    await self._run_cells(client)
                    await self._probe_wake(client)
                return
            except Exception as exc:
                if (fault := infrastructure_error(exc)) is None:
                    raise
                cold = await self._ride_out(engine, fault) or cold

    async def _ride_out(self, engine: EngineProcess, fault: InfrastructureFault) -> bool:
        """Note the fault, restart the engine if it is gone (True), else back off; stop when too many."""
        chunk, faults = self.plan.chunk, self.ctx.faults
        if not faults.spend():
            raise SweepAborted(
                f"{faults.limit} infrastructure faults in a row in chunk {chunk} and no point "
                f"finished; the last: {fault}. Check the engine ({self.engines.log_hint(engine)})"
            )
        self.sink.note(f"chunk {chunk}: {fault} (no attempt spent)")
        self.ctx.console.print(f"[yellow]chunk {chunk}: {fault}; no attempt spent", soft_wrap=True)
        restarted = await self.engines.recover(engine, str(fault))
        if not restarted:
            await faults.back_off(fault)
        return restarted

    async def _probe_wake(self, client: EngineClient) -> None:
        """The wake probe after the grid (``microbench.measure.wake``), once per chunk size."""
        chunk = self.plan.chunk
        if (wake := _wake_left(self.plan, self.sink)) is None:
            return
        gaps = ", ".join(f"{g:g}" for g in wake.gaps_s)
        self.ctx.events.describe(f"chunk {chunk}: wake probe (idle {gaps} s × {wake.repetitions})")
        with self.timing.phase("wake probe"):
            self.sink.wake(await probe_wake(client, self.space, wake, chunk))

    def _todo(self, d: int) -> list[tuple[int, int]]:
        """The (P, repetition) of D still to measure, once D's cells are judged against their repetitions."""
        chunk = self.plan.chunk
        judge_cells(self.plan, self.sink, self.ctx, [d])
        points = self.plan.points()
        return [(p, r) for dd, p, r in points if dd == d and not self.sink.is_done(chunk, d, p, r)]

    async def _run_cells(self, client: EngineClient) -> None:
        for d in self.plan.decode_batch_sizes:
            while todo := self._todo(d):
                await self._run_points(client, d, todo)

    async def _run_points(self, client: EngineClient, d: int, todo: list[tuple[int, int]]) -> None:
        """Measure every (P, repetition) of ``todo`` at D until each is final."""
        chunk = self.plan.chunk
        while todo:
            try:
                if d == 0:
                    await self._bare_points(client, todo)
                else:
                    await self._batched_points(client, d, todo)
            except ProtocolError as exc:
                # The engine answered but could not be brought into the state a measurement needs
                # (e.g. never idle): an attempt of the point in hand. Infrastructure faults go up.
                p, r = todo[0]
                self.fail_point(d, p, r, f"{type(exc).__name__}: {exc}")
                if self.sink.is_done(chunk, d, p, r):
                    todo.pop(0)

    def fail_point(self, d: int, p: int, r: int, why: str) -> None:
        """An attempt that failed outside the protocol's own checks: stored with why, derived like any."""
        self.store(Attempt(self.plan.config(d, p, r, 0), notes=[why]))

    def store(self, attempt: Attempt) -> bool:
        """Hand the attempt to the sink and report it; True when its point is final."""
        with self.timing.phase("store + derive"):
            stored = self.sink.point(attempt, self.plan.max_attempts)
        _report_invalid(self.ctx.console, stored)
        faults = self.ctx.faults
        if stored.blamed and not faults.spend():
            raise SweepAborted(f"{faults.limit} infrastructure faults in a row; the last: {stored.blamed[0]}")
        if stored.done:
            faults.progress()
        self.ctx.events.stored(stored)
        return stored.done

    async def point(
        self,
        client: EngineClient,
        batch: DecodeBatch | None,
        batch_file: str | None,
        point: Point,
        budget: int,
    ) -> bool:
        """One injection → one stored attempt → its record; True when the point is final."""
        d, p, r = point
        self.ctx.events.describe(f"chunk {self.plan.chunk} D{d} P{p} r{r}")
        with self.timing.phase("measurement windows"):
            inj = await inject(client, batch, p, self.space, self.rules)
        failure = batch.failure() if batch is not None else None
        if (inj.reasons or failure) and not await client.alive():
            # an error inside a stream (vLLM's engine core died) or a failure, and the engine is gone: the
            # infrastructure's fault however it showed up, not a verdict on the point (no attempt spent)
            raise InfrastructureFault(
                f"{INFRASTRUCTURE}the engine died during the point: {inj.reasons or failure}"
            )
        with self.timing.phase("store + derive"):
            stamps = raw_frame(batch, inj.prefill, inj.t_inject_ns - int(5e9), time.perf_counter_ns())
        attempt = Attempt(
            self.plan.config(d, p, r, budget),
            t_inject_ns=inj.t_inject_ns,
            t_first_token_ns=inj.t_first_token_ns,
            prompt_tokens=inj.prefill.prompt_tokens,
            cached_prompt_tokens=inj.prefill.cached_prompt_tokens,
            engine_steps=inj.steps if client.steps is not None else None,
            step_mode=client.steps.mode if client.steps is not None else None,
            notes=inj.reasons,
            decode_failure=failure,
            client_lag_max_ms=inj.client_lag_max_ms,
            baseline_file=batch_file,
            stamps=stamps,
            scrapes=(inj.before, inj.after),
            metrics=client.metrics,
        )
        return self.store(attempt)

    async def _bare_points(self, client: EngineClient, todo: list[tuple[int, int]]) -> None:
        while todo:
            p, r = todo[0]
            with self.timing.phase("idle waits"):
                await wait_idle(client, self.rules.idle_timeout_s)
            if await self.point(client, None, None, (0, p, r), 0):
                todo.pop(0)

    def _need(self, d: int, p: int) -> int:
        """Decode tokens one injection uses: local baseline, window, recovery, and slack."""
        plan = self.plan
        return (
            self.rules.local_gaps
            + num_prefill_steps(p, plan.chunk, d, plan.scheduling)
            + self.rules.recovery_gaps
            + 8
        )

    def _grown(self, budget: int, d: int) -> int:
        """The next batch's tokens after one ended before its point was injected, or when one point used
        more than a batch holds beside steady state and its baseline: twice as many, at most 4× the plan's
        and within the model's length. The plan counts the protocol's gaps, but a fast decode
        keeps producing tokens through every scrape and wait (CPU vLLM at 3 ms a step: 320 tokens passed
        between one point's baseline and its injection), so a batch planned for one repetition ran dry."""
        spec, planned = self.plan.spec, self.plan.decode_budgets[d]
        room = spec.max_model_len - self.plan.decode_context - 64 if spec.max_model_len else math.inf
        return int(max(budget, min(2 * budget, 4 * planned, room)))

    async def _batched_points(self, client: EngineClient, d: int, todo: list[tuple[int, int]]) -> None:
        budget = self.plan.decode_budgets[d]
        batch: DecodeBatch | None = None
        batch_file: str | None = None
        batch_index = 0
        unsteady = 0  # consecutive batches that ended before the point in hand could be injected
        used = 0  # most decode tokens one injection used (waits and scrape stalls included)
        injected = False  # whether the current batch has measured a point
        try:
            while todo:
                p, r = todo[0]
                try:
                    need = max(self._need(d, p), used + used // 4)
                    if batch is None or batch.failure() or batch.tokens_left() < need:
                        if batch is not None:
                            await batch.close()
                        batch = None
                        # what one batch must hold: steady state, its baseline and the point
                        floor = need + self.rules.steady_min_tokens + self.rules.baseline_gaps
                        while budget < floor and (bigger := self._grown(budget, d)) > budget:
                            budget = bigger
                        batch_index += 1
                        batch, batch_file = await self._new_batch(client, d, budget, batch_index - 1)
                        injected = False
                    left = batch.tokens_left()
                    if await self.point(client, batch, batch_file, (d, p, r), budget):
                        todo.pop(0)
                    used = max(used, left - batch.tokens_left())
                    unsteady, injected = 0, True
                except NotSteady as exc:
                    if batch is not None and (fault := batch_fault(batch.tasks)) is not None:
                        raise fault from exc  # a stream the engine refused or dropped: not unsteady
                    # Nothing was injected: the batch ran out of tokens or never settled. A fresh batch
                    # gets another chance; three in a row that never got one injection in make this
                    # point an invalid attempt (a batch that did measure simply used up its tokens).
                    if not injected:
                        unsteady += 1
                        budget = self._grown(budget, d)
                    if batch is not None:
                        await batch.close()
                    batch = None
                    if unsteady >= 3:
                        self.fail_point(d, p, r, f"never reached steady state: {exc}")
                        unsteady = 0
                        if self.sink.is_done(self.plan.chunk, d, p, r):
                            todo.pop(0)
                if batch is not None and batch.failure():
                    await batch.close()
                    batch = None
        finally:
            if batch is not None:
                await batch.close()

    async def _new_batch(
        self, client: EngineClient, d: int, budget: int, index: int
    ) -> tuple[DecodeBatch, str]:
        chunk = self.plan.chunk
        self.ctx.events.describe(f"chunk {chunk} D{d}: decode batch {index}, waiting for steady state")
        with self.timing.phase("idle waits"):
            await wait_idle(client, self.rules.idle_timeout_s)
        gc.collect()
        prompts = [self.prompts[i % len(self.prompts)] for i in range(d)]
        batch = DecodeBatch(client, prompts, budget, self.rules)
        await batch.start()
        try:
            with self.timing.phase("measurement windows"):
                baseline, steady_ms, _ = await measure_baseline(batch, self.rules)
        except ProtocolError as exc:
            await batch.close()
            if (fault := batch_fault(batch.tasks)) is not None:
                raise fault from exc  # e.g. HTTP 500 or a refused connection at a stream's start
            raise NotSteady(f"decode batch {index}: {exc}") from exc
        except BaseException:
            await batch.close()
            raise
        if baseline.tpot_p50_ms is not None and not math.isfinite(baseline.tpot_p50_ms):
            await batch.close()
            raise ProtocolError("baseline gaps are not finite")
        stamps = raw_frame(batch, None, batch.t_start_ns, time.perf_counter_ns())
        return batch, self.sink.baseline(chunk, d, index, baseline, steady_ms, stamps)


def _name(record: RunRecord) -> str:
    c = record.config
    return point_name(c.decode_batch_size, c.new_prefill_tokens, c.repetition)
