"""An interference shard's engine: start it (reporting its steps), sample telemetry, warm it up, bring
it back after it dies; what it ran and how it warmed up go to the shard's sink.

Engine differences come from the engine-kind table (``EngineKind.step_settings`` and ``step_source``),
never from ``if kind == …`` here.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp
from rich.console import Console
from rich.markup import escape

from engine_harness.engines import EngineSpec
from engine_harness.launch import EngineProcess
from engine_harness.step_modes import describe_step_mode
from engine_harness.telemetry import TelemetrySampler, default_source, engine_visible_devices
from microbench.client.aio import LagMonitor
from microbench.client.prompts import TokenSpace
from microbench.client.retry import with_retry
from microbench.measure.engine_client import EngineClient
from microbench.measure.interference import warm_up
from microbench.measure.sink import PointSink
from microbench.measure.timing import Timing

__all__ = ["MAX_ENGINE_RESTARTS", "EngineLifecycle", "SweepAborted"]

MAX_ENGINE_RESTARTS = 3
START_TIMEOUT_S = 600.0  # a launched engine's start-up (vLLM on CPU: about 60 s)
EXTERNAL_TIMEOUT_S = 30.0  # an external engine is already running: a closed port is known soon
PROBE_S = 30.0  # after a fault, how long an engine may take to answer /health before it counts as gone


class SweepAborted(RuntimeError):
    """The measurement cannot go on (e.g. an external engine stopped answering, too many faults)."""


class EngineLifecycle:
    """One engine per chunk size, as an interference shard needs it."""

    def __init__(
        self, sink: PointSink, console: Console, timing: Timing, start_timeout_s: float | None = None
    ) -> None:
        self.sink = sink
        self.console = console
        self.timing = timing
        self.restarts = 0
        self.start_timeout_s = start_timeout_s

    @contextlib.asynccontextmanager
    async def running(self, spec: EngineSpec, chunk: int, shard: str) -> AsyncIterator[EngineProcess]:
        """The engine ``spec`` (for ``chunk``), started with step reporting on, stopped on every exit path;
        its log and telemetry named ``shard`` (``ShardPlan.name``)."""
        kind_settings = EngineProcess.kind_of(spec).step_settings
        if kind_settings:
            spec = spec.model_copy(update=kind_settings)
        kind = EngineProcess.kind_of(spec)
        timeout = self.start_timeout_s or (START_TIMEOUT_S if kind.launched else EXTERNAL_TIMEOUT_S)
        log = self.sink.engine_log(shard) if kind.launched else None  # an external engine logs elsewhere
        engine = EngineProcess(spec, log, startup_timeout_s=timeout)
        with self.timing.phase("engine start"):
            await engine.start()
        self.restarts = 0
        self._record(chunk, engine)
        gpus = engine_visible_devices(spec.env)  # only the engine's GPUs are sampled
        sampler = TelemetrySampler(default_source(lambda: [engine.pid] if engine.pid else [], gpus), 0.5)
        sampler.start()
        ended_by: BaseException | None = None
        try:
            yield engine
        except BaseException as exc:
            ended_by = exc
            raise
        finally:
            sampler.stop()
            try:
                self._write_telemetry(sampler, shard, ended_by)
            finally:
                await engine.stop()

    def _write_telemetry(self, sampler: TelemetrySampler, shard: str, ended_by: BaseException | None) -> None:
        """The telemetry table of ``shard``. Written while the shard ends on an error (a dead engine, a full
        disk, Ctrl-C), a failure of its own is reported beside that error, never in its place."""
        try:
            sampler.write_parquet(self.sink.telemetry_path(shard))
        except OSError as exc:
            if ended_by is None:
                raise
            self.console.print(f"[yellow]shard {shard}: telemetry not written ({escape(str(exc))})[/]")

    def _record(self, chunk: int, engine: EngineProcess) -> None:
        self.sink.engine_started(chunk, engine.version, engine.argv, engine.metrics)
        self.console.print(
            f"chunk {chunk}: {engine.spec.kind} {engine.version or ''} at {engine.base_url} "
            f"(start-up {engine.startup_s or 0:.1f} s)"
        )

    @staticmethod
    def client(
        session: aiohttp.ClientSession, engine: EngineProcess, lag: LagMonitor | None = None
    ) -> EngineClient:
        steps = engine.kind.step_source(session, engine.base_url, engine.log_path)
        return EngineClient(
            session,
            engine.base_url,
            engine.spec.model_name,
            engine.metrics,
            steps,
            engine.auth_headers,
            lag,
        )

    async def warm(self, client: EngineClient, space: TokenSpace, chunk: int) -> None:
        """Warm up and verify (probes within 10%); the probes go to the sink."""
        warm = await warm_up(client, space, chunk)
        mode = None
        if client.steps is not None:
            await client.steps.mark()  # a source that asks the engine for its mode knows it from here on
            mode = client.steps.mode
        self.sink.warmed(chunk, warm.probes_ms, warm.verified, mode)
        if mode is not None:
            self.console.print(f"chunk {chunk}: {describe_step_mode(mode)}", soft_wrap=True)
        if not warm.verified:
            self.console.print(
                f"[yellow]chunk {chunk}: warm-up probes never settled within 10% "
                f"({', '.join(f'{p:.0f}' for p in warm.probes_ms[-5:])} ms); measuring anyway, "
                "each point still checks steady state",
                soft_wrap=True,
            )

    async def prime(self, client: EngineClient, prefix: list[int]) -> None:
        """Put the shared decode prefix in the prefix cache (retried if the engine turns it away)."""
        await with_retry(lambda: client.complete(prefix, 1))

    def log_hint(self, engine: EngineProcess) -> str:
        return f"its log: {engine.log_path}" if engine.log_path else f"it should answer at {engine.base_url}"

    async def recover(self, engine: EngineProcess, why: str) -> bool:
        """After an infrastructure fault: False if the engine still answers /health; True once an engine
        that died (or stopped answering) was restarted. An external engine that stopped answering, or an
        engine that keeps dying, ends the sweep (``SweepAborted``) with what to do."""
        probe_s = min(engine.startup_timeout_s, PROBE_S)
        if await engine.responsive(probe_s):
            return False
        if not engine.kind.launched:
            raise SweepAborted(
                f"the external engine at {engine.base_url} stopped answering (/health failed for "
                f"{probe_s:.0f} s after: {why}); once it answers again, continue with --resume"
            )
        self.restarts += 1
        if self.restarts > MAX_ENGINE_RESTARTS:
            raise SweepAborted(
                f"the engine died {self.restarts} times in this chunk; the last time: {why}. Look at "
                f"{engine.log_path} for its reason"
            )
        code = engine.proc.returncode if engine.proc is not None else None
        self.console.print(
            f"[yellow]engine died (exit code {code}); restarting it (restart {self.restarts})", soft_wrap=True
        )
        self.sink.note(f"engine restarted (restart {self.restarts}, exit code {code}) after: {why}")
        with self.timing.phase("engine start"):
            await engine.restart()  # stops the whole process group first (a hung engine included)
        return True
