"""The sweep's engine per chunk size: start it (reporting its steps), sample telemetry, warm it up,
bring it back after it dies, and say where the wall time went.

Engine differences come from the engine-kind table (``EngineKind.step_settings`` and ``step_source``),
never from ``if kind == …`` here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import aiohttp
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from benchcore.flags import hms
from benchcore.redact import redact_argv
from engine_harness.launch import EngineProcess
from engine_harness.step_modes import describe_step_mode
from engine_harness.telemetry import TelemetrySampler, default_source, engine_visible_devices
from microbench.client.aio import LagMonitor
from microbench.client.prompts import TokenSpace
from microbench.client.retry import with_retry
from microbench.results.layout import RunFolder
from microbench.sweep.config import SweepConfig
from microbench.sweep.protocol import EngineClient, warm_up

__all__ = ["MAX_ENGINE_RESTARTS", "EngineLifecycle", "SweepAborted", "Timing", "progress_bar"]

MAX_ENGINE_RESTARTS = 3
START_TIMEOUT_S = 600.0  # a launched engine's start-up (vLLM on CPU: about 60 s)
EXTERNAL_TIMEOUT_S = 30.0  # an external engine is already running: a closed port is known soon
PROBE_S = 30.0  # after a fault, how long an engine may take to answer /health before it counts as gone


class SweepAborted(RuntimeError):
    """The sweep cannot go on (e.g. an external engine stopped answering)."""


@dataclass
class Timing:
    """Where the wall time went, by phase (``with timing.phase(name):``); the rest is "other".

    Phases: ``engine start`` (and restarts), ``measurement windows`` (Phase 1 baselines with their wait
    for steady state, and every injection's window), ``warm-up`` (warm-up probes and the shared prefix),
    ``idle waits`` (until the engine runs nothing before a batch or a bare point), ``store + derive``
    (writing a point's files and deriving its record from them).
    """

    t0: float = field(default_factory=time.perf_counter)
    spent: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t

    def report(self) -> str:
        wall = time.perf_counter() - self.t0
        start = self.spent.get("engine start", 0.0)
        other = max(wall - sum(self.spent.values()), 0.0)
        after = max(wall - start, 1e-9)
        parts = [f"{name} {s:.1f} s" for name, s in self.spent.items() if name != "engine start"]
        return (
            f"wall {wall:.1f} s = engine start {start:.1f} s + "
            + " + ".join([*parts, f"other {other:.1f} s"])
            + f"; after engine start: measurement windows "
            f"{self.spent.get('measurement windows', 0.0) / after:.0%}"
        )


class _Progress(Progress):
    """Rich's live bar on a terminal; elsewhere (a log file, CI, ``nohup``), where rich draws nothing
    until the end, one plain line at most every ``every_s`` as points finish."""

    def __init__(self, *columns: ProgressColumn, console: Console, every_s: float) -> None:
        super().__init__(*columns, console=console, transient=False)
        self.every_s = every_s
        self._last = time.monotonic()

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        if self.console.is_terminal or time.monotonic() - self._last < self.every_s:
            return
        self._last = time.monotonic()
        task = next(t for t in self.tasks if t.id == task_id)
        left = task.time_remaining
        self.console.print(
            f"{task.completed:.0f}/{task.total:.0f} points, {hms(task.elapsed or 0.0)} in, "
            + ("ETA –" if left is None else f"ETA {hms(left)}")
            + f" · {task.description}",
            soft_wrap=True,
        )


def progress_bar(console: Console, every_s: float = 60.0) -> Progress:
    """The sweep's one progress line: what it does, points done of all, elapsed time and ETA."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    return _Progress(*columns, console=console, every_s=every_s)


class EngineLifecycle:
    """One engine per chunk size, as the sweep needs it."""

    def __init__(
        self,
        folder: RunFolder,
        sweep: SweepConfig,
        console: Console,
        timing: Timing,
        start_timeout_s: float | None = None,
    ) -> None:
        self.folder = folder
        self.sweep = sweep
        self.console = console
        self.timing = timing
        self.restarts = 0
        self.start_timeout_s = start_timeout_s

    @contextlib.asynccontextmanager
    async def running(self, chunk: int) -> AsyncIterator[EngineProcess]:
        """The engine for ``chunk``, started with step reporting on, stopped on every exit path."""
        spec = self.sweep.engine_spec(chunk)
        kind_settings = EngineProcess.kind_of(spec).step_settings
        if kind_settings:
            spec = spec.model_copy(update=kind_settings)
        kind = EngineProcess.kind_of(spec)
        timeout = self.start_timeout_s or (START_TIMEOUT_S if kind.launched else EXTERNAL_TIMEOUT_S)
        log = self.folder.engine_log(chunk) if kind.launched else None  # an external engine logs elsewhere
        engine = EngineProcess(spec, log, startup_timeout_s=timeout)
        with self.timing.phase("engine start"):
            await engine.start()
        self.restarts = 0
        self._record(chunk, engine)
        gpus = engine_visible_devices(spec.env)  # only the engine's GPUs are sampled
        sampler = TelemetrySampler(default_source(lambda: [engine.pid] if engine.pid else [], gpus), 0.5)
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
        manifest.engine_argv[str(chunk)] = redact_argv(engine.argv)  # no --api-key value in the manifest
        self.folder.write_manifest(manifest)
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
            engine.kind.metrics,
            steps,
            engine.auth_headers,
            lag,
        )

    async def warm(self, client: EngineClient, space: TokenSpace, chunk: int) -> None:
        """Warm up and verify (probes within 10%); the probes go to the manifest."""
        warm = await warm_up(client, space, chunk)
        manifest = self.folder.read_manifest()
        manifest.warmup[str(chunk)] = {
            "probes_ms": [round(p, 3) for p in warm.probes_ms],
            "verified": warm.verified,
        }
        if client.steps is not None:
            await client.steps.mark()  # a source that asks the engine for its mode knows it from here on
            if (mode := client.steps.mode) is not None:
                manifest.step_modes[str(chunk)] = mode
                self.console.print(f"chunk {chunk}: {describe_step_mode(mode)}", soft_wrap=True)
        self.folder.write_manifest(manifest)
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
        self.folder.add_note(f"engine restarted (restart {self.restarts}, exit code {code}) after: {why}")
        with self.timing.phase("engine start"):
            await engine.restart()  # stops the whole process group first (a hung engine included)
        return True
