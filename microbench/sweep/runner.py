"""Runs a ``SweepConfig`` into a ``RunFolder``: engines per chunk, decode batches per D, injections.

The runner owns the order of work, retries, engine restarts, progress display and timing; the
measurement itself is ``microbench.sweep.protocol``. Every point is written the moment it is final, so a
crash, Ctrl-C or a full disk loses at most the point in flight.
"""

from __future__ import annotations

import gc
import math
import time

import aiohttp
from rich.progress import Progress, TaskID

from benchcore.console import console
from engine_harness.engines import engine_kind
from engine_harness.launch import EngineProcess
from engine_harness.step_model import Scheduling, num_prefill_steps
from microbench.client.aio import LagMonitor, no_full_collections
from microbench.client.prompts import TokenSpace, shared_prefix, token_space_for
from microbench.results.faults import infrastructure_reasons
from microbench.results.layout import RunFolder, attempt_stem
from microbench.results.records import (
    BaselineRecord,
    Observation,
    RunConfig,
    point_name,
)
from microbench.sweep.config import SweepConfig
from microbench.sweep.faults import FaultBudget, InfrastructureFault, batch_fault, infrastructure_error
from microbench.sweep.lifecycle import EngineLifecycle, SweepAborted, Timing, progress_bar
from microbench.sweep.protocol import (
    DecodeBatch,
    EngineClient,
    NotSteady,
    ProtocolError,
    inject,
    measure_baseline,
    raw_frame,
    wait_idle,
)
from microbench.sweep.summary import print_summary

__all__ = ["SweepRunner"]

Point = tuple[int, int, int, int]  # chunk, D, P, repetition


class SweepRunner:
    def __init__(self, folder: RunFolder, sweep: SweepConfig, start_timeout_s: float | None = None) -> None:
        self.folder = folder
        self.sweep = sweep
        self.rules = sweep.protocol
        self.console = console()
        self.timing = Timing()
        self.engines = EngineLifecycle(folder, sweep, self.console, self.timing, start_timeout_s)
        self.lag = LagMonitor()
        self.invalid_attempts = 0
        self.faults = FaultBudget()
        self.last_ratio: float | None = None
        self.progress: Progress | None = None
        self.task_id: TaskID | None = None
        self._hardware: str | None = None
        spec = sweep.engine_spec()
        self.space = TokenSpace.parse(sweep.token_range) if sweep.token_range else token_space_for(spec.model)
        self.prefix = shared_prefix(sweep.decode_context, self.space, sweep.seed)

    # -- top level ---------------------------------------------------------------------------------

    async def run(self) -> None:
        total = self.sweep.points()
        done = sum(self.folder.is_done(c, d, p, r) for c, d, p, r in self._grid())
        if done:
            self.console.print(f"resuming {self.folder.root.name}: {done}/{total} points already measured")
        with progress_bar(self.console) as progress:
            self.progress = progress
            self.task_id = progress.add_task("starting", total=total, completed=done)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
            self.lag.start()
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    for chunk in self.sweep.chunks:
                        if all(self.folder.is_done(chunk, d, p, r) for _, d, p, r in self._grid(chunk)):
                            continue
                        self._describe(f"chunk {chunk}: starting the engine")
                        async with self.engines.running(chunk) as engine:
                            await self._run_chunk(session, engine, chunk)
            finally:
                await self.lag.stop()

    def invalid_points(self) -> int:
        """Points of this run recorded as finally invalid (their attempts spent)."""
        records = (self.folder.stored_record(*point) for point in self._grid())
        return sum(1 for record in records if record is not None and not record.validity.valid)

    def finish(self) -> None:
        """Write the table and print the summary from whatever is on disk."""
        self.console.print(self.timing.report())
        if self.invalid_attempts:
            self.console.print(
                f"{self.invalid_attempts} invalid attempt(s) kept under "
                f"{self.folder.root / 'invalid'} with their reasons"
            )
        print_summary(self.folder.root, self.console)

    def _grid(self, chunk: int | None = None) -> list[tuple[int, int, int, int]]:
        chunks = [chunk] if chunk is not None else self.sweep.chunks
        return [
            (c, d, p, r)
            for c in chunks
            for d in self.sweep.decode_batch_sizes
            for r in range(self.sweep.repetitions)
            for p in self.sweep.prefill_tokens
        ]

    def _describe(self, text: str) -> None:
        if self.progress is not None and self.task_id is not None:
            ratio = f"{self.last_ratio:.2f}×" if self.last_ratio is not None else "–"
            self.progress.update(
                self.task_id,
                description=f"{text} · last penalty ratio {ratio} · invalid {self.invalid_attempts}",
            )

    # -- one chunk -----------------------------------------------------------------------------------

    async def _run_chunk(self, session: aiohttp.ClientSession, engine: EngineProcess, chunk: int) -> None:
        """Warm up, prime the shared prefix, measure every point left; ride out infrastructure faults."""
        cold = True
        while True:
            client = self.engines.client(session, engine, self.lag)
            try:
                with self.timing.phase("warm-up"):
                    if cold:
                        self._describe(f"chunk {chunk}: warming up")
                        await self.engines.warm(client, self.space, chunk)
                        cold = False
                    # Prime the shared decode prefix once so every decode stream starts as a cache hit.
                    await self.engines.prime(client, self.prefix)
                with no_full_collections():
                    await self._run_cells(client, chunk)
                return
            except Exception as exc:
                if (fault := infrastructure_error(exc)) is None:
                    raise
                cold = await self._ride_out(engine, chunk, fault) or cold

    async def _ride_out(self, engine: EngineProcess, chunk: int, fault: InfrastructureFault) -> bool:
        """Note the fault, restart the engine if it is gone (True), else back off; stop when too many."""
        if not self.faults.spend():
            raise SweepAborted(
                f"{self.faults.limit} infrastructure faults in a row in chunk {chunk} and no point "
                f"finished; the last: {fault}. Check the engine ({self.engines.log_hint(engine)})"
            )
        self.folder.add_note(f"chunk {chunk}: {fault} (no attempt spent)")
        self.console.print(f"[yellow]chunk {chunk}: {fault}; no attempt spent", soft_wrap=True)
        restarted = await self.engines.recover(engine, str(fault))
        if not restarted:
            await self.faults.back_off(fault)
        return restarted

    async def _run_cells(self, client: EngineClient, chunk: int) -> None:
        for d in self.sweep.decode_batch_sizes:
            todo = [
                (p, r)
                for _, dd, p, r in self._grid(chunk)
                if dd == d and not self.folder.is_done(chunk, d, p, r)
            ]
            while todo:
                try:
                    if d == 0:
                        await self._bare_points(client, chunk, todo)
                    else:
                        await self._batched_points(client, chunk, d, todo)
                except ProtocolError as exc:
                    # The engine answered but could not be brought into the state a measurement needs
                    # (e.g. never idle): an attempt of the point in hand. Infrastructure faults go up.
                    p, r = todo[0]
                    self._fail_point(chunk, d, p, r, f"{type(exc).__name__}: {exc}")
                    if self.folder.is_done(chunk, d, p, r):
                        todo.pop(0)

    def _config(self, chunk: int, d: int, p: int, r: int, budget: int) -> RunConfig:
        if self._hardware is None:
            hw = self.folder.read_manifest().hardware
            self._hardware = ", ".join(hw.get("gpus") or []) or f"CPU: {hw.get('cpu')}"
        gpu = self._hardware
        engine = self.sweep.engine_spec(chunk)
        return RunConfig(
            decode_batch_size=d,
            new_prefill_tokens=p,
            chunk_size=chunk,
            model=engine.model_name,
            gpu=gpu,
            repetition=r,
            engine=engine.kind,
            decode_context=self.sweep.decode_context,
            decode_max_tokens=budget if d else 0,
            scheduling=self._scheduling(chunk),
        )

    def _fail_point(self, chunk: int, d: int, p: int, r: int, why: str) -> None:
        """An attempt that failed outside the protocol's own checks: stored with why, derived like any."""
        obs = Observation(
            run_id=self.folder.root.name,
            config=self._config(chunk, d, p, r, 0),
            attempt=self.folder.attempts(chunk, d, p, r),
            t_inject_ns=time.perf_counter_ns(),
            t_first_token_ns=None,
            prompt_tokens=None,
            cached_prompt_tokens=None,
            engine_steps=None,
            notes=[why],
            baseline_file=None,
            raw_file=None,
            metrics_file=None,
        )
        self._finish_point(obs)

    def _finish_point(self, obs: Observation) -> bool:
        """Store the observation, derive the record from what the folder now holds, store the record.
        An attempt spoiled by the infrastructure (``results.faults``) spends none of ``max_attempts``."""
        c = obs.config
        key = (c.chunk_size, c.decode_batch_size, c.new_prefill_tokens, c.repetition)
        spent = self.folder.spent_attempts(*key)
        record = self.folder.derive_attempt(self.folder.write_observation(obs))
        blamed = infrastructure_reasons(record.validity.reasons) if not record.validity.valid else []
        final = not blamed and spent + 1 >= self.sweep.max_attempts
        self.folder.write_point(record, final)
        if not record.validity.valid:
            self.invalid_attempts += 1
            self.console.print(
                f"[yellow]invalid: chunk {c.chunk_size} "
                f"{point_name(c.decode_batch_size, c.new_prefill_tokens, c.repetition)} "
                f"attempt {record.validity.attempt}: {'; '.join(record.validity.reasons)}"
                + (" (infrastructure: not counted)" if blamed else "")
            )
        else:
            self.last_ratio = record.derived.penalty_ratio
        done = record.validity.valid or final
        if blamed and not self.faults.spend():
            raise SweepAborted(f"{self.faults.limit} infrastructure faults in a row; the last: {blamed[0]}")
        if done:
            self.faults.progress()
            if self.progress is not None and self.task_id is not None:
                self.progress.advance(self.task_id)
        return done

    async def _point(
        self, client: EngineClient, batch: DecodeBatch | None, batch_file: str | None, key: Point, budget: int
    ) -> bool:
        """One injection → one stored attempt → its record; True when the point is final."""
        chunk, d, p, r = key
        self._describe(f"chunk {chunk} D{d} P{p} r{r}")
        with self.timing.phase("measurement windows"):
            inj = await inject(client, batch, p, self.space, self.rules)
        with self.timing.phase("store + derive"):
            attempt = self.folder.attempts(chunk, d, p, r)
            stem = attempt_stem(d, p, r, attempt)
            raw, scrapes = self.folder.raw_name(chunk, stem), self.folder.metrics_name(chunk, stem)
            t_lo = inj.t_inject_ns - int(5e9)
            self.folder.write_raw(raw, raw_frame(batch, inj.prefill, t_lo, time.perf_counter_ns()))
            self.folder.write_scrapes(scrapes, inj.before, inj.after, client.metrics)
            obs = Observation(
                run_id=self.folder.root.name,
                config=self._config(chunk, d, p, r, budget),
                attempt=attempt,
                t_inject_ns=inj.t_inject_ns,
                t_first_token_ns=inj.t_first_token_ns,
                prompt_tokens=inj.prefill.prompt_tokens,
                cached_prompt_tokens=inj.prefill.cached_prompt_tokens,
                engine_steps=inj.steps if client.steps is not None else None,
                step_mode=client.steps.mode if client.steps is not None else None,
                notes=inj.reasons,
                decode_failure=batch.failure() if batch is not None else None,
                client_lag_max_ms=inj.client_lag_max_ms,
                baseline_file=batch_file,
                raw_file=raw,
                metrics_file=scrapes,
            )
            return self._finish_point(obs)

    async def _bare_points(self, client: EngineClient, chunk: int, todo: list[tuple[int, int]]) -> None:
        while todo:
            p, r = todo[0]
            with self.timing.phase("idle waits"):
                await wait_idle(client, self.rules.idle_timeout_s)
            if await self._point(client, None, None, (chunk, 0, p, r), 0):
                todo.pop(0)

    def _need(self, chunk: int, d: int, p: int) -> int:
        """Decode tokens one injection uses: local baseline, window, recovery, and slack."""
        return (
            self.rules.local_gaps
            + num_prefill_steps(p, chunk, d, self._scheduling(chunk))
            + self.rules.recovery_gaps
            + 8
        )

    def _scheduling(self, chunk: int) -> Scheduling:
        spec = self.sweep.engine_spec(chunk)
        return engine_kind(spec.kind).scheduling(spec)

    async def _batched_points(
        self, client: EngineClient, chunk: int, d: int, todo: list[tuple[int, int]]
    ) -> None:
        budget = self.sweep.decode_budget(chunk, d)
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
                    need = max(self._need(chunk, d, p), used + used // 4)
                    if batch is None or batch.failure() or batch.tokens_left() < need:
                        if batch is not None:
                            await batch.close()
                        batch = None
                        batch_index += 1
                        batch, batch_file = await self._new_batch(client, chunk, d, budget, batch_index - 1)
                        injected = False
                    left = batch.tokens_left()
                    if await self._point(client, batch, batch_file, (chunk, d, p, r), budget):
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
                    if batch is not None:
                        await batch.close()
                    batch = None
                    if unsteady >= 3:
                        self._fail_point(chunk, d, p, r, f"never reached steady state: {exc}")
                        unsteady = 0
                        if self.folder.is_done(chunk, d, p, r):
                            todo.pop(0)
                if batch is not None and batch.failure():
                    await batch.close()
                    batch = None
        finally:
            if batch is not None:
                await batch.close()

    async def _new_batch(
        self, client: EngineClient, chunk: int, d: int, budget: int, index: int
    ) -> tuple[DecodeBatch, str]:
        self._describe(f"chunk {chunk} D{d}: decode batch {index}, waiting for steady state")
        with self.timing.phase("idle waits"):
            await wait_idle(client, self.rules.idle_timeout_s)
        gc.collect()
        batch = DecodeBatch(client, self.prefix, d, budget, self.rules)
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
        raw = self.folder.raw_name(chunk, f"baseline_D{d}_b{index}")
        self.folder.write_raw(raw, raw_frame(batch, None, batch.t_start_ns, time.perf_counter_ns()))
        rel = self.folder.baseline_name(chunk, d, index)
        self.folder.write_baseline(
            rel,
            BaselineRecord(
                run_id=self.folder.root.name,
                chunk_size=chunk,
                decode_batch_size=d,
                batch_index=index,
                baseline=baseline,
                steady_after_ms=steady_ms,
                raw_file=raw,
            ),
        )
        return batch, rel
