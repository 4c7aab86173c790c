"""The sweep's engine per chunk size: start it (reporting its steps), sample telemetry, warm it up,
bring it back after it dies, and say where the wall time went.

Engine differences come from the engine-kind table (``EngineKind.step_settings`` and ``step_source``),
never from ``if kind == …`` here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from rich.console import Console

from engine_harness.launch import EngineProcess
from engine_harness.telemetry import TelemetrySampler, default_source
from microbench.client.prompts import TokenSpace
from microbench.results.layout import RunFolder
from microbench.sweep.config import SweepConfig
from microbench.sweep.protocol import EngineClient, warm_up

__all__ = ["MAX_ENGINE_RESTARTS", "EngineLifecycle", "SweepAborted", "Timing"]

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


class EngineLifecycle:
    """One engine per chunk size, as the sweep needs it."""

    def __init__(self, folder: RunFolder, sweep: SweepConfig, console: Console, timing: Timing) -> None:
        self.folder = folder
        self.sweep = sweep
        self.console = console
        self.timing = timing
        self.restarts = 0

    @contextlib.asynccontextmanager
    async def running(self, chunk: int) -> AsyncIterator[EngineProcess]:
        """The engine for ``chunk``, started with step reporting on, stopped on every exit path."""
        spec = self.sweep.engine_spec(chunk)
        kind_settings = EngineProcess.kind_of(spec).step_settings
        if kind_settings:
            spec = spec.model_copy(update=kind_settings)
        engine = EngineProcess(spec, self.folder.engine_log(chunk))
        t = time.perf_counter()
        await engine.start()
        self.timing.engine_start_s += time.perf_counter() - t
        self.restarts = 0
        self._record(chunk, engine)
        sampler = TelemetrySampler(default_source(lambda: [engine.pid] if engine.pid else []), interval_s=0.5)
        sampler.start()
        try:
            yield engine
        finally:
            sampler.stop()
            sampler.write_parquet(self.folder.telemetry_path(chunk))
            await engine.stop()

    def _record(self, chunk: int, engine: EngineProcess) -> None:
        manifest = self.folder.read_manifest()
        manifest.engine_version = engine.version
        manifest.engine_argv[str(chunk)] = engine.argv
        self.folder.write_manifest(manifest)
        self.console.print(
            f"chunk {chunk}: {engine.spec.kind} {engine.version or ''} at {engine.base_url} "
            f"(start-up {engine.startup_s or 0:.1f} s)"
        )

    @staticmethod
    def client(session: aiohttp.ClientSession, engine: EngineProcess) -> EngineClient:
        steps = engine.kind.step_source(session, engine.base_url, engine.log_path)
        headers = {"Authorization": f"Bearer {engine.api_key}"} if engine.api_key else {}
        return EngineClient(
            session, engine.base_url, engine.spec.model_name, engine.kind.metrics, steps, headers
        )

    async def warm(self, client: EngineClient, space: TokenSpace, chunk: int) -> None:
        """Warm up and verify (probes within 10%); the probes go to the manifest."""
        warm = await warm_up(client, space, chunk)
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

    async def recover(self, engine: EngineProcess, why: str) -> bool:
        """After a failure: False if the engine lives; restart it (True) if it died and we own it."""
        if engine.alive():
            return False
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
        return True
