"""Runs a ``SweepConfig`` into a ``RunFolder``: engines per chunk, decode batches per D, injections.

The runner owns the order of work, retries, engine restarts, progress display and timing; the
measurement itself is ``microbench.protocol``. Every point is written the moment it is final, so a
crash, Ctrl-C or a full disk loses at most the point in flight.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from engine_harness.engines import Scheduling, engine_kind
from engine_harness.launch import EngineError, EngineProcess
from engine_harness.metrics import MetricsError, Snapshot
from engine_harness.telemetry import TelemetrySampler, default_source
from microbench.aio import no_full_collections
from microbench.engine_steps import SimStepSource, StepSource, VllmLogStepSource
from microbench.prompts import TokenSpace, shared_prefix, token_space_for
from microbench.protocol import (
    DecodeBatch,
    EngineClient,
    Injection,
    NotSteady,
    ProtocolError,
    ProtocolSettings,
    build_record,
    expected_chunks,
    inject,
    measure_baseline,
    raw_frame,
    wait_idle,
    warm_up,
)
from microbench.records import Baseline, BaselineRecord, RunConfig, RunRecord, point_name, write_record
from microbench.run_folder import RunFolder
from microbench.sglang_steps import SglangLogStepSource
from microbench.streams import StreamError, StreamRecord
from microbench.sweep_config import SweepConfig
from microbench.sweep_summary import print_summary

__all__ = ["SweepAborted", "SweepRunner"]

MAX_ENGINE_RESTARTS = 3


class SweepAborted(RuntimeError):
    """The sweep cannot go on (e.g. an external engine stopped answering)."""


@dataclass
class Timing:
    """Where the wall time went: engine start-up, measurement windows, everything else."""

    t0: float = field(default_factory=time.perf_counter)
    engine_start_s: float = 0.0
    measure_s: float = 0.0

    def report(self) -> str:
        wall = time.perf_counter() - self.t0
        overhead = max(wall - self.engine_start_s - self.measure_s, 0.0)
        share = overhead / max(wall - self.engine_start_s, 1e-9)
        return (
            f"wall {wall:.1f} s = engine start {self.engine_start_s:.1f} s + measurement windows "
            f"{self.measure_s:.1f} s + harness overhead {overhead:.1f} s "
            f"({share:.1%} of the time after engine start)"
        )


class SweepRunner:
    def __init__(self, folder: RunFolder, sweep: SweepConfig) -> None:
        self.folder = folder
        self.sweep = sweep
        self.s = ProtocolSettings(**sweep.protocol.model_dump())
        self.console = Console()
        self.timing = Timing()
        self.invalid_attempts = 0
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
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=self.console, transient=False) as progress:
            self.progress = progress
            self.task_id = progress.add_task("starting", total=total, completed=done)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for chunk in self.sweep.chunks:
                    if all(self.folder.is_done(chunk, d, p, r) for _, d, p, r in self._grid(chunk)):
                        continue
                    async with self._engine(chunk) as engine:
                        await self._run_chunk(session, engine, chunk)

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

    # -- engines -----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _engine(self, chunk: int) -> AsyncIterator[EngineProcess]:
        spec = self.sweep.engine_spec(chunk)
        if spec.kind in ("vllm", "sglang"):  # their per-step logs are the step source
            spec = spec.model_copy(update={"log_iteration_details": True})
        engine = EngineProcess(spec, self.folder.engine_log(chunk))
        self._describe(f"chunk {chunk}: starting {spec.kind} engine")
        t = time.perf_counter()
        await engine.start()
        self.timing.engine_start_s += time.perf_counter() - t
        self._record_engine(chunk, engine)
        sampler = TelemetrySampler(default_source(lambda: [engine.pid] if engine.pid else []), interval_s=0.5)
        sampler.start()
        try:
            yield engine
        finally:
            sampler.stop()
            sampler.write_parquet(self.folder.root / "telemetry" / f"{chunk}.parquet")
            await engine.stop()

    def _record_engine(self, chunk: int, engine: EngineProcess) -> None:
        manifest = self.folder.read_manifest()
        manifest.engine_version = engine.version
        manifest.engine_argv[str(chunk)] = engine.argv
        self.folder.write_manifest(manifest)
        self.console.print(
            f"chunk {chunk}: {engine.spec.kind} {engine.version or ''} at {engine.base_url} "
            f"(start-up {engine.startup_s or 0:.1f} s)"
        )

    def _client(self, session: aiohttp.ClientSession, engine: EngineProcess) -> EngineClient:
        steps: StepSource | None = None
        if engine.spec.kind == "vllm" and engine.spec.log_iteration_details and engine.log_path:
            steps = VllmLogStepSource(engine.log_path)
        elif (
            engine.spec.kind == "sglang"
            and engine.spec.log_iteration_details
            and not engine.spec.overlap_schedule  # with it, the step lines come a step late
            and engine.log_path
        ):
            steps = SglangLogStepSource(engine.log_path, mixed=engine.spec.mixed_chunk)
        elif engine.spec.kind == "sim":
            steps = SimStepSource(session, engine.base_url)
        headers = {"Authorization": f"Bearer {engine.api_key}"} if engine.api_key else {}
        return EngineClient(
            session, engine.base_url, engine.spec.model_name, engine.kind.metrics, steps, headers
        )

    async def _recover_engine(self, engine: EngineProcess, why: str) -> None:
        """After a failure: nothing to do if the engine lives; restart it if it died and we own it."""
        if engine.alive():
            return
        if not engine.kind.launched:
            raise SweepAborted(f"the external engine at {engine.base_url} stopped answering ({why})")
        self.restarts += 1
        if self.restarts > MAX_ENGINE_RESTARTS:
            raise SweepAborted(
                f"engine died {self.restarts} times in this chunk; last: {why}; see {engine.log_path}"
            )
        self.console.print(f"[yellow]engine died ({why}); restarting it (restart {self.restarts})")
        t = time.perf_counter()
        await engine.restart()
        self.timing.engine_start_s += time.perf_counter() - t

    # -- one chunk -----------------------------------------------------------------------------------

    async def _run_chunk(self, session: aiohttp.ClientSession, engine: EngineProcess, chunk: int) -> None:
        self.restarts = 0
        client = self._client(session, engine)
        self._describe(f"chunk {chunk}: warming up")
        warm = await warm_up(client, self.space, chunk)
        manifest = self.folder.read_manifest()
        manifest.warmup[str(chunk)] = {
            "probes_ms": [round(p, 3) for p in warm.probes_ms],
            "verified": warm.verified,
        }
        self.folder.write_manifest(manifest)
        if not warm.verified:
            self.console.print(
                f"[yellow]chunk {chunk}: warm-up probes never settled within 10% "
                f"({', '.join(f'{p:.0f}' for p in warm.probes_ms[-5:])} ms); measuring anyway, "
                "each point still checks steady state",
                soft_wrap=True,
            )
        # Prime the shared decode prefix once so every decode stream starts as a cache hit.
        await client.complete(self.prefix, 1)
        with no_full_collections():
            await self._run_cells(session, engine, client, chunk)

    async def _run_cells(
        self, session: aiohttp.ClientSession, engine: EngineProcess, client: EngineClient, chunk: int
    ) -> None:
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
                except (StreamError, aiohttp.ClientError, MetricsError, EngineError, ProtocolError) as exc:
                    # Something outside one point's checks failed: count an attempt for the point in
                    # flight, bring the engine back if it died, and go on with a fresh batch.
                    p, r = todo[0]
                    self._fail_point(client, chunk, d, p, r, f"{type(exc).__name__}: {exc}")
                    if self.folder.is_done(chunk, d, p, r):
                        todo.pop(0)
                    await self._recover_engine(engine, str(exc))
                    client = self._client(session, engine)
                    await client.complete(self.prefix, 1)

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

    def _attempt(self, chunk: int, d: int, p: int, r: int) -> int:
        return len(list((self.folder.root / "invalid" / str(chunk)).glob(f"{point_name(d, p, r)}_a*.json")))

    def _fail_point(self, client: EngineClient, chunk: int, d: int, p: int, r: int, why: str) -> None:
        attempt = self._attempt(chunk, d, p, r)
        inj = Injection(StreamRecord(), time.perf_counter_ns(), None, Snapshot(0, {}), None, [], [why])
        record = build_record(
            self.folder.root.name,
            self._config(chunk, d, p, r, 0),
            None,
            None,
            inj,
            attempt,
            self.s,
            client.metrics,
            raw_file="",
        )
        self._finish_point(record, final=attempt + 1 >= self.sweep.max_attempts)

    def _finish_point(self, record: RunRecord, final: bool) -> bool:
        self.folder.write_point(record, final)
        c = record.config
        if not record.validity.valid:
            self.invalid_attempts += 1
            self.console.print(
                f"[yellow]invalid: chunk {c.chunk_size} "
                f"{point_name(c.decode_batch_size, c.new_prefill_tokens, c.repetition)} "
                f"attempt {record.validity.attempt}: {'; '.join(record.validity.reasons)}"
            )
        else:
            self.last_ratio = record.derived.penalty_ratio
        done = record.validity.valid or final
        if done and self.progress is not None and self.task_id is not None:
            self.progress.advance(self.task_id)
        return done

    async def _point(
        self,
        client: EngineClient,
        batch: DecodeBatch | None,
        baseline: Baseline | None,
        chunk: int,
        d: int,
        p: int,
        r: int,
        budget: int,
    ) -> bool:
        """One injection → one record; True when the point is final (valid, or out of attempts)."""
        self._describe(f"chunk {chunk} D{d} P{p} r{r}")
        attempt = self._attempt(chunk, d, p, r)
        stem = f"{point_name(d, p, r)}_a{attempt}"
        t = time.perf_counter()
        inj = await inject(client, batch, p, self.space, self.s)
        self.timing.measure_s += time.perf_counter() - t
        raw = self.folder.raw_name(chunk, stem)
        record = build_record(
            self.folder.root.name,
            self._config(chunk, d, p, r, budget),
            batch,
            baseline,
            inj,
            attempt,
            self.s,
            client.metrics,
            raw,
        )
        t_lo = inj.t_inject_ns - int(5e9)
        self.folder.write_raw(raw, raw_frame(batch, inj.prefill, t_lo, time.perf_counter_ns()))
        if inj.after is not None:
            self.folder.write_scrapes(chunk, stem, inj.before, inj.after)
        return self._finish_point(record, final=attempt + 1 >= self.sweep.max_attempts)

    async def _bare_points(self, client: EngineClient, chunk: int, todo: list[tuple[int, int]]) -> None:
        while todo:
            p, r = todo[0]
            await wait_idle(client, self.s.idle_timeout_s)
            if await self._point(client, None, None, chunk, 0, p, r, 0):
                todo.pop(0)

    def _need(self, chunk: int, d: int, p: int) -> int:
        """Decode tokens one injection uses: local baseline, window, recovery, and slack."""
        return (
            self.s.local_gaps
            + expected_chunks(p, chunk, d, self._scheduling(chunk))
            + self.s.recovery_gaps
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
        baseline: Baseline | None = None
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
                        batch, baseline = await self._new_batch(client, chunk, d, budget, batch_index - 1)
                        injected = False
                    left = batch.tokens_left()
                    if await self._point(client, batch, baseline, chunk, d, p, r, budget):
                        todo.pop(0)
                    used = max(used, left - batch.tokens_left())
                    unsteady, injected = 0, True
                except NotSteady as exc:
                    # Nothing was injected: the batch ran out of tokens or never settled. A fresh batch
                    # gets another chance; three in a row that never got one injection in make this
                    # point an invalid attempt (a batch that did measure simply used up its tokens).
                    if not injected:
                        unsteady += 1
                    if batch is not None:
                        await batch.close()
                    batch = None
                    if unsteady >= 3:
                        self._fail_point(client, chunk, d, p, r, f"never reached steady state: {exc}")
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
    ) -> tuple[DecodeBatch, Baseline]:
        self._describe(f"chunk {chunk} D{d}: decode batch {index}, waiting for steady state")
        await wait_idle(client, self.s.idle_timeout_s)
        gc.collect()
        batch = DecodeBatch(client, self.prefix, d, budget)
        await batch.start()
        try:
            t = time.perf_counter()
            baseline, steady_ms, _ = await measure_baseline(batch, self.s)
            self.timing.measure_s += time.perf_counter() - t
        except ProtocolError as exc:
            await batch.close()
            raise NotSteady(f"decode batch {index}: {exc}") from exc
        except BaseException:
            await batch.close()
            raise
        raw = self.folder.raw_name(chunk, f"baseline_D{d}_b{index}")
        self.folder.write_raw(raw, raw_frame(batch, None, batch.t_start_ns, time.perf_counter_ns()))
        write_record(
            self.folder.root / "baselines" / str(chunk) / f"D{d}_b{index}.json",
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
        if baseline.tpot_p50_ms is not None and not math.isfinite(baseline.tpot_p50_ms):
            raise ProtocolError("baseline gaps are not finite")
        return batch, baseline
